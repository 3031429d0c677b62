#include "kernels/communicator.h"

#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace duet::kernels {
namespace {

// Runs fn(rank) on one thread per rank of a new group of `n`.
template <typename Fn>
void OnRanks(int n, Fn fn) {
  std::vector<CommunicatorPtr> comms = NewThreadCommunicators(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(*comms[r]); });
  for (std::thread& t : threads) t.join();
}

TEST_CASE("AllReduceSum gives every rank the sum, added in rank order", "[communicator]") {
  for (int n : {1, 2, 3}) {
    for (int64_t len : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}}) {
      std::vector<std::vector<float>> bufs(n, std::vector<float>(len));
      OnRanks(n, [&](Communicator& c) {
        REQUIRE(c.size() == n);
        std::vector<float>& b = bufs[c.rank()];
        for (int64_t i = 0; i < len; ++i) b[i] = static_cast<float>(c.rank() * 1000 + i);
        c.AllReduceSum(b.data(), len);
      });
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < len; ++i) {
          float want = 0;
          for (int k = 0; k < n; ++k) want += static_cast<float>(k * 1000 + i);
          REQUIRE(bufs[r][i] == want);
        }
      }
    }
  }
  // 1e8 + -1e8 + 1 is 1 added left to right and 0 right to left (float).
  std::vector<std::vector<float>> bufs = {{1e8f}, {-1e8f}, {1.0f}};
  OnRanks(3, [&](Communicator& c) { c.AllReduceSum(bufs[c.rank()].data(), 1); });
  for (const auto& b : bufs) REQUIRE(b[0] == 1.0f);
}

TEST_CASE("AllReduceSum runs back to back, each call its own", "[communicator]") {
  // Three ranks on this machine's two cores: some barriers are met by
  // spinning, some by blocking.
  for (int n : {2, 3}) {
    INFO(n << " ranks");
    std::vector<float> last(n);
    OnRanks(n, [&](Communicator& c) {
      float v = 0;
      for (int step = 0; step < 2000; ++step) {
        float x = static_cast<float>(step * (c.rank() + 1));
        c.AllReduceSum(&x, 1);
        v += x;  // step x (1 + 2 + ... + n)
      }
      last[c.rank()] = v;
    });
    // Every partial sum is an integer under 2^24: exact in float.
    CHECK(last[0] == static_cast<float>(int64_t{n * (n + 1) / 2} * 1999 * 2000 / 2));
    for (int r = 1; r < n; ++r) CHECK(last[r] == last[0]);
  }
}

TEST_CASE("Send and Recv pass messages between two ranks in order", "[communicator]") {
  std::vector<float> got(5, -1);
  OnRanks(3, [&](Communicator& c) {
    // A ring: 0 -> 1 -> 2, each adding its rank; then 2 answers 0 twice.
    std::vector<float> msg(5);
    if (c.rank() == 0) {
      for (int i = 0; i < 5; ++i) msg[i] = static_cast<float>(i);
      c.Send(1, msg.data(), 5);
      float a = 0, b = 0;
      c.Recv(2, &a, 1);
      c.Recv(2, &b, 1);
      REQUIRE(a == 10.0f);
      REQUIRE(b == 20.0f);
    } else if (c.rank() == 1) {
      c.Recv(0, msg.data(), 5);
      for (float& v : msg) v += 1;
      c.Send(2, msg.data(), 5);
    } else {
      c.Recv(1, got.data(), 5);
      const float a = 10, b = 20;
      c.Send(0, &a, 1);
      c.Send(0, &b, 1);
    }
  });
  REQUIRE(got == std::vector<float>{1, 2, 3, 4, 5});
}

}  // namespace
}  // namespace duet::kernels

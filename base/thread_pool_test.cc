#include "base/thread_pool.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

namespace duet {
namespace {

TEST_CASE("ParallelFor covers every index exactly once", "[thread_pool]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 100, 1001}) {
      std::vector<int> hits(n, 0);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
    }
  }
}

TEST_CASE("nested ParallelFor runs inline and completes", "[thread_pool]") {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> sums(8);
  pool.ParallelFor(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, [&](int64_t ib, int64_t ie) { sums[i] += static_cast<int>(ie - ib); });
    }
  });
  for (auto& s : sums) REQUIRE(s.load() == 10);
}

TEST_CASE("min_grain bounds the chunk size", "[thread_pool]") {
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<int64_t> sizes;
  pool.ParallelFor(100, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    sizes.push_back(e - b);
  }, 30);
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  REQUIRE(total == 100);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    // All chunks but the last one handed out are at least the grain.
    if (sizes[i] < 30) REQUIRE(sizes[i] == 100 % 30);
  }
}

}  // namespace
}  // namespace duet

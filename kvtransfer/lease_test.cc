#include "kvtransfer/lease.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "kvtransfer/loopback/loopback_transport.h"

namespace duet::kvtransfer {
namespace {

using Reason = LeaseTable::EndReason;
constexpr int32_t kBlocks = 16;
constexpr uint64_t kBlockBytes = 64;

struct Fixture {
  Fixture()
      : transport(NewLoopbackTransport()),
        pool(kBlocks * kBlockBytes),
        region(transport->RegisterRegion(pool.data(), pool.size(), kBlocks).value()),
        table(transport.get(), region, kBlocks, &clock,
              [this](uint64_t, const std::vector<int32_t>& blocks, Reason reason) {
                absl::MutexLock lock(&mu);
                ends.push_back({blocks, reason});
              }) {}
  uint64_t Epoch(int32_t b) { return transport->BlockEpoch(region, b); }
  std::vector<std::pair<std::vector<int32_t>, Reason>> Ends() {
    absl::MutexLock lock(&mu);
    return ends;
  }
  FakeClock clock;
  KvTransportPtr transport;
  std::vector<uint8_t> pool;
  RegionId region;
  absl::Mutex mu;
  std::vector<std::pair<std::vector<int32_t>, Reason>> ends;
  LeaseTable table;
};

TEST_CASE("a released lease bumps its blocks' epochs, then tells the owner", "[lease]") {
  Fixture f;
  f.transport->BumpEpoch(f.region, 3);  // an earlier use of block 3
  auto lease = f.table.Grant({3, 7}, absl::Seconds(10));
  REQUIRE(lease.ok());
  REQUIRE(lease->block_epochs == std::vector<std::pair<int32_t, uint64_t>>{{3, 1}, {7, 0}});
  REQUIRE(lease->deadline == f.clock.Now() + absl::Seconds(10));
  REQUIRE(f.table.IsLeased(3));
  REQUIRE(f.table.num_live() == 1);
  REQUIRE(f.Ends().empty());

  REQUIRE(f.table.Release(lease->id).ok());
  REQUIRE(f.Epoch(3) == 2);
  REQUIRE(f.Epoch(7) == 1);
  REQUIRE(f.Epoch(4) == 0);
  REQUIRE(f.Ends().size() == 1);
  REQUIRE(f.Ends()[0].first == std::vector<int32_t>{3, 7});
  REQUIRE(f.Ends()[0].second == Reason::kReleased);
  REQUIRE(!f.table.IsLeased(3));
  REQUIRE(f.table.num_live() == 0);
  // Ended once: a second end is NotFound and bumps nothing.
  REQUIRE(f.table.Release(lease->id).code() == absl::StatusCode::kNotFound);
  REQUIRE(f.table.Cancel(lease->id).code() == absl::StatusCode::kNotFound);
  REQUIRE(f.Epoch(3) == 2);
  REQUIRE(f.Ends().size() == 1);
}

TEST_CASE("leases expire at their deadline on the injected clock", "[lease]") {
  Fixture f;
  auto a = f.table.Grant({1}, absl::Seconds(5)).value();
  auto b = f.table.Grant({2, 3}, absl::Seconds(8)).value();
  REQUIRE(f.table.NextDeadline() == a.deadline);
  f.clock.Advance(absl::Seconds(5) - absl::Nanoseconds(1));
  REQUIRE(f.table.ExpireDue() == 0);
  REQUIRE(f.Epoch(1) == 0);
  f.clock.Advance(absl::Nanoseconds(1));
  REQUIRE(f.table.ExpireDue() == 1);
  REQUIRE(f.Epoch(1) == 1);
  REQUIRE(f.Ends().back().second == Reason::kExpired);
  REQUIRE(f.table.NextDeadline() == b.deadline);
  // Released before its deadline: it never expires.
  REQUIRE(f.table.Release(b.id).ok());
  f.clock.Advance(absl::Hours(1));
  REQUIRE(f.table.ExpireDue() == 0);
  REQUIRE(f.table.NextDeadline() == std::nullopt);
  REQUIRE(f.Epoch(2) == 1);  // bumped once, by the release
  // An expired lease cannot be released afterwards.
  REQUIRE(f.table.Release(a.id).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a cancelled lease and CancelAll report cancelled", "[lease]") {
  Fixture f;
  auto a = f.table.Grant({0}, absl::Seconds(5)).value();
  f.table.Grant({1}, absl::Seconds(5)).value();
  f.table.Grant({2}, absl::Seconds(5)).value();
  REQUIRE(f.table.Cancel(a.id).ok());
  REQUIRE(f.Ends().back().second == Reason::kCancelled);
  REQUIRE(f.table.CancelAll() == 2);
  REQUIRE(f.Ends().size() == 3);
  REQUIRE(f.Epoch(0) == 1);
  REQUIRE(f.Epoch(1) == 1);
  REQUIRE(f.Epoch(2) == 1);
  REQUIRE(f.table.num_live() == 0);
}

TEST_CASE("a block under two leases keeps its epoch until the last ends", "[lease]") {
  Fixture f;
  auto a = f.table.Grant({4, 5}, absl::Seconds(5)).value();
  auto b = f.table.Grant({5, 6}, absl::Seconds(9)).value();
  REQUIRE(b.block_epochs[0] == std::pair<int32_t, uint64_t>{5, 0});
  REQUIRE(f.table.Release(a.id).ok());
  REQUIRE(f.Epoch(4) == 1);
  REQUIRE(f.Epoch(5) == 0);  // still promised to b
  REQUIRE(f.table.IsLeased(5));
  f.clock.Advance(absl::Seconds(9));
  REQUIRE(f.table.ExpireDue() == 1);
  REQUIRE(f.Epoch(5) == 1);
  REQUIRE(f.Epoch(6) == 1);
  REQUIRE(f.Ends()[1].first == std::vector<int32_t>{5, 6});
}

TEST_CASE("Grant rejects bad requests", "[lease]") {
  Fixture f;
  auto code = [&](std::vector<int32_t> blocks, absl::Duration d) {
    return f.table.Grant(blocks, d).status().code();
  };
  REQUIRE(code({}, absl::Seconds(1)) == absl::StatusCode::kInvalidArgument);
  REQUIRE(code({1, 1}, absl::Seconds(1)) == absl::StatusCode::kInvalidArgument);
  REQUIRE(code({-1}, absl::Seconds(1)) == absl::StatusCode::kInvalidArgument);
  REQUIRE(code({kBlocks}, absl::Seconds(1)) == absl::StatusCode::kInvalidArgument);
  REQUIRE(code({1}, absl::ZeroDuration()) == absl::StatusCode::kInvalidArgument);
  REQUIRE(f.table.num_live() == 0);
}

TEST_CASE("a pull with a lease's epochs works until the lease ends", "[lease]") {
  Fixture f;
  KvTransportPtr decode = NewLoopbackTransport();
  std::vector<uint8_t> dst(kBlockBytes);
  PullRequest req;
  req.peer = decode->Connect(f.transport->address()).value();
  req.remote_region = f.transport->ExportRegion(f.region).value();
  req.local_region = decode->RegisterRegion(dst.data(), dst.size(), 0).value();
  req.segments = {{9 * kBlockBytes, 0, kBlockBytes}};
  auto lease = f.table.Grant({9}, absl::Seconds(5)).value();
  req.block_epochs = lease.block_epochs;
  REQUIRE(decode->Wait(decode->Pull(req).value()).state == TransferState::kDone);
  f.clock.Advance(absl::Seconds(5));
  REQUIRE(f.table.ExpireDue() == 1);
  REQUIRE(decode->Wait(decode->Pull(req).value()).state == TransferState::kLeaseExpired);
}

TEST_CASE("on_end may call back into the table", "[lease]") {
  FakeClock clock;
  KvTransportPtr t = NewLoopbackTransport();
  std::vector<uint8_t> pool(kBlocks * kBlockBytes);
  RegionId region = t->RegisterRegion(pool.data(), pool.size(), kBlocks).value();
  LeaseTable* self = nullptr;
  size_t live_seen = 99;
  LeaseTable table(t.get(), region, kBlocks, &clock,
                   [&](uint64_t, const std::vector<int32_t>&, Reason) { live_seen = self->num_live(); });
  self = &table;
  auto a = table.Grant({1}, absl::Seconds(1)).value();
  table.Grant({2}, absl::Seconds(1)).value();
  REQUIRE(table.Release(a.id).ok());
  REQUIRE(live_seen == 1);
}

TEST_CASE("concurrent grants and ends: every lease ends exactly once", "[lease]") {
  Fixture f;
  constexpr int kThreads = 4, kPerThread = 500;
  std::atomic<int> errors{0};  // Catch2 assertions are not thread-safe
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < kPerThread; ++n) {
        auto l = f.table.Grant({static_cast<int32_t>((i * 4 + n) % kBlocks)}, absl::Seconds(1));
        if (!l.ok()) {
          errors++;
          continue;
        }
        if (n % 3 == 0) {
          if (!f.table.Release(l->id).ok()) errors++;
        } else if (n % 3 == 1) {
          if (!f.table.Cancel(l->id).ok()) errors++;
        } else {
          f.table.ExpireDue();  // may end others' leases too, never twice
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors == 0);
  f.clock.Advance(absl::Seconds(1));
  f.table.ExpireDue();
  REQUIRE(f.table.num_live() == 0);
  REQUIRE(f.Ends().size() == kThreads * kPerThread);
  uint64_t bumps = 0;
  for (int32_t b = 0; b < kBlocks; ++b) bumps += f.Epoch(b);
  REQUIRE(bumps <= static_cast<uint64_t>(kThreads * kPerThread));
  REQUIRE(bumps > 0);
}

}  // namespace
}  // namespace duet::kvtransfer

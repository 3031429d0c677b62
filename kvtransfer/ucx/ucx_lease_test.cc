// Leases over UCX: a kv_peer exporter keeps ending leases (bump the epoch,
// rewrite the block for the new epoch) while this importer pulls blocks with
// the epochs it last read. Every pull must be exactly the promised epoch's
// bytes or kLeaseExpired: a torn or stale block is never delivered as done.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace duet::kvtransfer {
namespace {

TEST_CASE("pulls racing lease expiry are exact or lease expired, never a mix", "[ucx][lease]") {
  constexpr int32_t kBlocks = 64;
  constexpr uint64_t kBlock = 32 << 10;
  constexpr uint64_t kSeed = 31;
  auto peer = testing::StartKvPeer(kBlocks, kBlock, kSeed);
  REQUIRE(peer.ok());
  Subprocess& exporter = *peer->process;

  auto made = NewUcxTransport({});
  REQUIRE(made.ok());
  KvTransport& t = **made;
  // Up to 1.5 MiB: pulls of 1 MiB and more are copied by several threads on
  // the same-host lane, whose epoch reads must still frame every one of them.
  constexpr int kMaxPull = 48;
  auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, kMaxPull * kBlock));
  RegionId local = t.RegisterRegion(dst, kMaxPull * kBlock, 0).value();
  PeerId p = t.Connect(peer->address).value();

  REQUIRE(exporter.Call("expire-loop 0").value() == "ok");
  std::mt19937_64 rng(7);
  int done = 0, expired_before = 0, expired_during = 0, pulls = 0;
  absl::Time give_up = absl::Now() + absl::Seconds(30);
  // Run until both outcomes were seen often enough to mean something.
  while ((done < 1000 || expired_before + expired_during < 1000) && absl::Now() < give_up) {
    ++pulls;
    int count = static_cast<int>(rng() % kMaxPull) + 1;
    std::vector<int32_t> blocks;
    while (static_cast<int>(blocks.size()) < count) {
      auto b = static_cast<int32_t>(rng() % kBlocks);
      if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
    }
    std::vector<uint64_t> epochs = testing::PeerEpochs(exporter, blocks).value();
    PullRequest req;
    req.peer = p;
    req.remote_region = peer->region;
    req.local_region = local;
    for (int i = 0; i < count; ++i) {
      req.segments.push_back({blocks[i] * kBlock, i * kBlock, kBlock});
      req.block_epochs.push_back({blocks[i], epochs[i]});
    }
    std::memset(dst, 0, kMaxPull * kBlock);
    TransferResult r = t.Wait(t.Pull(req).value());
    INFO("pull " << pulls << ": " << TransferStateName(r.state) << " " << r.detail);
    if (r.state == TransferState::kDone) {
      ++done;
      for (int i = 0; i < count; ++i) {
        int64_t bad = testing::FirstMismatch(dst + i * kBlock, kSeed, blocks[i], epochs[i], 0, kBlock);
        INFO("block " << blocks[i] << " promised epoch " << epochs[i] << ", first wrong byte " << bad);
        REQUIRE(bad == -1);
      }
    } else {
      REQUIRE(r.state == TransferState::kLeaseExpired);
      if (r.detail.find("during") != std::string::npos) {
        ++expired_during;
      } else {
        ++expired_before;
      }
    }
  }
  std::string stopped = exporter.Call("stop").value();
  std::cerr << pulls << " pulls: " << done << " done, " << expired_before
            << " lease expired before the pull, " << expired_during << " during it; exporter "
            << stopped << "\n";
  REQUIRE(done > 0);
  REQUIRE(expired_before + expired_during > 0);
  REQUIRE(exporter.Call("quit").value() == "bye");
  made->reset();
  std::free(dst);
}

}  // namespace
}  // namespace duet::kvtransfer

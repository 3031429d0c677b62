// UcxKvTransport under exporter failures: an exporter SIGKILLed in the middle
// of a 256 MiB pull, and one SIGSTOPped so that its reads never complete
// (deadline, Cancel, Disconnect). Exporters are kv_peer processes.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/metrics.h"
#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace duet::kvtransfer {
namespace {

using testing::FirstMismatch;
using testing::StartKvPeer;

constexpr uint8_t kFill = 0xa5;
// The default PullRequest timeout: a dead peer must be reported within it.
constexpr absl::Duration kPeerTimeout = absl::Seconds(5);

struct Pool {
  explicit Pool(uint64_t bytes) : bytes(bytes) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(data, kFill, bytes);
  }
  ~Pool() { std::free(data); }
  bool AllFill() const {
    for (uint64_t i = 0; i < bytes; ++i) {
      if (data[i] != kFill) return false;
    }
    return true;
  }
  uint8_t* data;
  uint64_t bytes;
};

// Whole blocks [0, blocks) to the same place, with every epoch promised at 0.
PullRequest WholePool(PeerId peer, const std::string& region, RegionId local, int32_t blocks,
                      uint64_t block_bytes) {
  PullRequest req;
  req.peer = peer;
  req.remote_region = region;
  req.local_region = local;
  for (int32_t b = 0; b < blocks; ++b) {
    req.segments.push_back({b * block_bytes, b * block_bytes, block_bytes});
    req.block_epochs.push_back({b, 0});
  }
  return req;
}

bool PoolMatches(const Pool& pool, uint64_t seed, int32_t blocks, uint64_t block_bytes) {
  for (int32_t b = 0; b < blocks; ++b) {
    if (FirstMismatch(pool.data + b * block_bytes, seed, b, 0, 0, block_bytes) >= 0) return false;
  }
  return true;
}

// A pull from the transport itself: once it is done, the progress thread
// has started (issued the first reads of) every pull queued before it.
class SelfPull {
 public:
  explicit SelfPull(KvTransport& t) : t_(t), src_(4096), dst_(4096) {
    RegionId src = t.RegisterRegion(src_.data, src_.bytes, 1).value();
    req_.peer = t.Connect(t.address()).value();
    req_.remote_region = t.ExportRegion(src).value();
    req_.local_region = t.RegisterRegion(dst_.data, dst_.bytes, 0).value();
    req_.segments = {{0, 0, 4096}};
  }
  bool Done() { return t_.Wait(t_.Pull(req_).value()).state == TransferState::kDone; }

 private:
  KvTransport& t_;
  Pool src_, dst_;
  PullRequest req_;
};

double PeerLostCount() {
  return MetricsRegistry::Default()
      .GetCounter("duet_kv_transfer_failures_total", "",
                  {{"transport", "ucx"}, {"reason", "peer_lost"}})
      ->Value();
}

TEST_CASE("an exporter killed mid-pull: its pulls end peer lost within the timeout", "[ucx][fault]") {
  constexpr int32_t kBigBlocks = 64;
  constexpr uint64_t kBigBlock = 4ull << 20;  // 256 MiB in all
  constexpr int32_t kSmallBlocks = 16;
  constexpr uint64_t kSmallBlock = 64 << 10;
  auto doomed = StartKvPeer(kBigBlocks, kBigBlock, 11);
  auto survivor = StartKvPeer(kSmallBlocks, kSmallBlock, 12);
  REQUIRE(doomed.ok());
  REQUIRE(survivor.ok());

  auto made = NewUcxTransport({});
  REQUIRE(made.ok());
  KvTransport& t = **made;
  Pool big(kBigBlocks * kBigBlock), small(kSmallBlocks * kSmallBlock);
  RegionId big_region = t.RegisterRegion(big.data, big.bytes, 0).value();
  RegionId small_region = t.RegisterRegion(small.data, small.bytes, 0).value();
  PeerId doomed_peer = t.Connect(doomed->address).value();
  PeerId survivor_peer = t.Connect(survivor->address).value();

  // One block first, so the endpoint is wired up before the big pull.
  PullRequest one = WholePool(doomed_peer, doomed->region, big_region, 1, kBigBlock);
  REQUIRE(t.Wait(t.Pull(one).value()).state == TransferState::kDone);

  double lost_before = PeerLostCount();
  PullRequest all = WholePool(doomed_peer, doomed->region, big_region, kBigBlocks, kBigBlock);
  SelfPull self(t);
  TransferId in_flight = t.Pull(all).value();
  REQUIRE(self.Done());  // the big pull's reads are on the wire
  absl::Time killed = absl::Now();
  REQUIRE(doomed->process->Signal(SIGKILL).ok());
  doomed->process->Wait();  // gone for good before the next pulls
  std::vector<TransferId> after;
  for (int i = 0; i < 4; ++i) after.push_back(t.Pull(i % 2 ? all : one).value());

  TransferResult r = t.Wait(in_flight);
  INFO("in-flight pull: " << TransferStateName(r.state) << " " << r.detail);
  REQUIRE((r.state == TransferState::kPeerLost || r.state == TransferState::kDone));
  REQUIRE(r.bytes <= big.bytes);
  if (r.state == TransferState::kDone) {
    REQUIRE(PoolMatches(big, 11, kBigBlocks, kBigBlock));
  } else {
    REQUIRE(r.detail.find("peer lost") != std::string::npos);
  }
  for (TransferId id : after) {
    TransferResult a = t.Wait(id);
    INFO("pull after the kill: " << TransferStateName(a.state) << " " << a.detail);
    REQUIRE(a.state == TransferState::kPeerLost);
  }
  absl::Duration took = absl::Now() - killed;
  INFO("all pulls ended " << took << " after the kill");
  std::cerr << "killed mid-pull: the in-flight pull ended " << TransferStateName(r.state)
            << " after " << r.bytes << " bytes; all pulls ended " << took << " after the kill\n";
  REQUIRE(took < kPeerTimeout + absl::Seconds(1));
  REQUIRE(PeerLostCount() >= lost_before + 4);

  // The dead endpoint was dropped: the same address gives a new one, whose
  // pulls fail as peer lost too (nobody listens there any more).
  auto again = t.Connect(doomed->address);
  if (again.ok()) {
    REQUIRE(*again != doomed_peer);
    one.peer = *again;
    absl::Time start = absl::Now();
    TransferResult a = t.Wait(t.Pull(one).value());
    INFO(a.detail);
    REQUIRE(a.state == TransferState::kPeerLost);
    REQUIRE(absl::Now() - start < kPeerTimeout + absl::Seconds(1));
  }

  // Other exporters are unaffected.
  PullRequest live = WholePool(survivor_peer, survivor->region, small_region, kSmallBlocks,
                               kSmallBlock);
  TransferResult s = t.Wait(t.Pull(live).value());
  INFO(s.detail);
  REQUIRE(s.state == TransferState::kDone);
  REQUIRE(PoolMatches(small, 12, kSmallBlocks, kSmallBlock));
  REQUIRE(survivor->process->Call("quit").value() == "bye");
}

TEST_CASE("a stopped exporter: deadline, Cancel and Disconnect end pulls that never write later",
          "[ucx][fault]") {
  constexpr int32_t kBlocks = 16;
  constexpr uint64_t kBlock = 256 << 10;
  auto peer = StartKvPeer(kBlocks, kBlock, 21);
  REQUIRE(peer.ok());
  UcxTransportOptions options;
  options.cancel_grace = absl::Milliseconds(100);
  // A stopped process stalls UCX's lanes only: the same-host lane reads it
  // without its help (the next test).
  options.same_host_lane = false;
  auto made = NewUcxTransport(options);
  REQUIRE(made.ok());
  KvTransport& t = **made;
  Pool stale(kBlocks * kBlock), fresh(kBlocks * kBlock);
  RegionId stale_region = t.RegisterRegion(stale.data, stale.bytes, 0).value();
  RegionId fresh_region = t.RegisterRegion(fresh.data, fresh.bytes, 0).value();
  PeerId p = t.Connect(peer->address).value();
  PullRequest warm = WholePool(p, peer->region, fresh_region, 1, kBlock);
  REQUIRE(t.Wait(t.Pull(warm).value()).state == TransferState::kDone);

  SelfPull self(t);
  auto started = [&] { return self.Done(); };

  REQUIRE(peer->process->Stop().ok());
  PullRequest req = WholePool(p, peer->region, stale_region, kBlocks, kBlock);
  req.timeout = absl::Seconds(30);
  // Its reads are sent and never answered: Cancel must end it, and the
  // reads UCX cannot cancel cost the endpoint.
  TransferId cancelled = t.Pull(req).value();
  REQUIRE(started());
  absl::Time start = absl::Now();
  t.Cancel(cancelled);
  TransferResult c = t.Wait(cancelled);
  INFO(c.detail);
  REQUIRE(c.state == TransferState::kCancelled);
  absl::Duration took = absl::Now() - start;
  REQUIRE(took >= options.cancel_grace);
  REQUIRE(took < options.cancel_grace + absl::Seconds(2));

  // A new endpoint to the stopped peer cannot even wire up, so this pull
  // meets its deadline.
  PeerId p2 = t.Connect(peer->address).value();
  REQUIRE(p2 != p);
  req.peer = p2;
  req.timeout = absl::Milliseconds(300);
  start = absl::Now();
  TransferResult d = t.Wait(t.Pull(req).value());
  INFO(d.detail);
  REQUIRE(d.state == TransferState::kTimedOut);
  took = absl::Now() - start;
  REQUIRE(took >= req.timeout);
  REQUIRE(took < req.timeout + options.cancel_grace + absl::Seconds(2));

  // Disconnect ends a pull at once, as cancelled.
  PeerId p3 = t.Connect(peer->address).value();
  req.peer = p3;
  req.timeout = absl::Seconds(30);
  TransferId dropped = t.Pull(req).value();
  REQUIRE(started());
  t.Disconnect(p3);
  start = absl::Now();
  TransferResult e = t.Wait(dropped);
  REQUIRE(e.state == TransferState::kCancelled);
  REQUIRE(absl::Now() - start < absl::Seconds(2));

  // The peer wakes up and answers the old reads; none of them may land.
  REQUIRE(peer->process->Continue().ok());
  PeerId p4 = t.Connect(peer->address).value();
  PullRequest ok = WholePool(p4, peer->region, fresh_region, kBlocks, kBlock);
  TransferResult f = t.Wait(t.Pull(ok).value());
  INFO(f.detail);
  REQUIRE(f.state == TransferState::kDone);
  REQUIRE(PoolMatches(fresh, 21, kBlocks, kBlock));
  REQUIRE(peer->process->Call("epochs 0").value() == "epochs 0");  // a round trip after the old reads
  REQUIRE(t.Wait(t.Pull(ok).value()).state == TransferState::kDone);
  REQUIRE(stale.AllFill());
  REQUIRE(peer->process->Call("quit").value() == "bye");
}

TEST_CASE("the same-host lane reads a stopped exporter; UCX_TLS=tcp keeps pulls on UCX",
          "[ucx][fault]") {
  // With UCX_TLS=tcp (the _tcp_ variant) every read needs the exporter's
  // progress thread, so a stopped exporter makes the pull time out.
  const char* tls = std::getenv("UCX_TLS");
  const bool same_host = tls == nullptr || std::string(tls).empty();
  constexpr int32_t kBlocks = 16;
  constexpr uint64_t kBlock = 256 << 10;
  auto peer = StartKvPeer(kBlocks, kBlock, 23);
  REQUIRE(peer.ok());
  UcxTransportOptions options;
  options.cancel_grace = absl::Milliseconds(100);
  auto made = NewUcxTransport(options);
  REQUIRE(made.ok());
  KvTransport& t = **made;
  Pool pool(kBlocks * kBlock);
  RegionId region = t.RegisterRegion(pool.data, pool.bytes, 0).value();
  PeerId p = t.Connect(peer->address).value();
  // Wired up before the stop (UCX 1.13 asserts in a process continued
  // halfway through wire-up).
  PullRequest req = WholePool(p, peer->region, region, 1, kBlock);
  REQUIRE(t.Wait(t.Pull(req).value()).state == TransferState::kDone);
  REQUIRE(peer->process->Stop().ok());
  req = WholePool(p, peer->region, region, kBlocks, kBlock);
  req.timeout = absl::Seconds(same_host ? 5 : 1);
  TransferResult r = t.Wait(t.Pull(req).value());
  INFO(r.detail);
  if (same_host) {
    REQUIRE(r.state == TransferState::kDone);
    REQUIRE(r.bytes == kBlocks * kBlock);
    REQUIRE(PoolMatches(pool, 23, kBlocks, kBlock));
  } else {
    REQUIRE(r.state == TransferState::kTimedOut);
  }
  REQUIRE(peer->process->Continue().ok());
  REQUIRE(peer->process->Call("quit").value() == "bye");
}

}  // namespace
}  // namespace duet::kvtransfer

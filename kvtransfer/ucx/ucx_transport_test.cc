// UcxKvTransport: request validation and lease checks against itself, then
// 1,000 random pulls from a kv_peer process with every byte checked. Built
// twice: with the environment's UCX transports and with UCX_TLS=tcp.
#include "kvtransfer/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/metrics.h"
#include "kvtransfer/layout.h"
#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/testing/peer_process.h"

namespace duet::kvtransfer {
namespace {

using testing::FirstMismatch;
using testing::KvPeer;
using testing::StartKvPeer;

constexpr uint8_t kFill = 0xa5;

struct Pool {
  explicit Pool(uint64_t bytes) : bytes(bytes) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(data, kFill, bytes);
  }
  ~Pool() { std::free(data); }
  uint8_t* data;
  uint64_t bytes;
};

double CounterValue(const std::string& name, const Labels& labels) {
  return MetricsRegistry::Default().GetCounter(name, "", labels)->Value();
}

// Checks every destination byte of `segments` against the source pattern at
// `epoch`, splitting at source block boundaries; returns a description of
// the first wrong byte, or "".
std::string CheckSegments(const uint8_t* dst, const std::vector<Segment>& segments, uint64_t seed,
                          uint64_t block_bytes, uint64_t epoch) {
  for (const Segment& s : segments) {
    uint64_t done = 0;
    while (done < s.length) {
      uint64_t src = s.src_offset + done;
      auto block = static_cast<int32_t>(src / block_bytes);
      uint64_t inner = src % block_bytes;
      uint64_t n = std::min(s.length - done, block_bytes - inner);
      int64_t bad = FirstMismatch(dst + s.dst_offset + done, seed, block, epoch, inner, inner + n);
      if (bad >= 0) {
        return "segment src " + std::to_string(s.src_offset) + " dst " +
               std::to_string(s.dst_offset) + " len " + std::to_string(s.length) +
               ": wrong byte at block " + std::to_string(block) + " offset " + std::to_string(bad);
      }
      done += n;
    }
  }
  return "";
}

TEST_CASE("a UCX transport pulls from itself and checks epochs", "[ucx]") {
  UcxTransportOptions options;
  // Both ways of driving the worker: sleeping on its event fd, or spinning.
  options.busy_poll = GENERATE(false, true);
  options.spin_window = absl::Microseconds(GENERATE(0, 50));
  auto made = NewUcxTransport(options);
  REQUIRE(made.ok());
  KvTransport& t = **made;
  REQUIRE(t.Name() == "ucx");
  constexpr uint64_t kBlock = 4096;
  constexpr int32_t kBlocks = 8;
  Pool src(kBlock * kBlocks), dst(kBlock * kBlocks);
  for (int32_t b = 0; b < kBlocks; ++b) testing::FillBlock(src.data + b * kBlock, kBlock, 5, b, 0);
  auto src_region = t.RegisterRegion(src.data, src.bytes, kBlocks);
  auto dst_region = t.RegisterRegion(dst.data, dst.bytes, 0);
  REQUIRE(src_region.ok());
  REQUIRE(dst_region.ok());
  auto exported = t.ExportRegion(*src_region);
  REQUIRE(exported.ok());
  auto peer = t.Connect(t.address());
  REQUIRE(peer.ok());
  // The same address gives the same endpoint.
  REQUIRE(*t.Connect(t.address()) == *peer);

  PullRequest req;
  req.peer = *peer;
  req.remote_region = *exported;
  req.local_region = *dst_region;
  req.segments = {{3 * kBlock, 0, kBlock}, {5 * kBlock + 10, kBlock + 10, 1000}};
  req.block_epochs = {{3, 0}, {5, 0}};

  SECTION("a pull with the promised epochs is done and every byte is right") {
    const Labels ucx = {{"transport", "ucx"}};
    double bytes_before = CounterValue("duet_kv_transfer_bytes_total", ucx);
    Histogram* seconds = MetricsRegistry::Default().GetHistogram(
        "duet_kv_transfer_seconds", "", ucx, TransferBucketsSeconds());
    uint64_t observed_before = seconds->Collect().histogram.sample_count;
    Gauge* in_flight = MetricsRegistry::Default().GetGauge("duet_kv_transfers_in_flight", "", ucx);
    const double in_flight_before = in_flight->Value();
    auto id = t.Pull(req);
    REQUIRE(id.ok());
    TransferResult r = t.Wait(*id);
    INFO(r.detail);
    REQUIRE(r.state == TransferState::kDone);
    REQUIRE(r.bytes == kBlock + 1000);
    REQUIRE(CheckSegments(dst.data, req.segments, 5, kBlock, 0) == "");
    REQUIRE(dst.data[kBlock + 9] == kFill);     // untouched around the partial segment
    REQUIRE(dst.data[kBlock + 1010] == kFill);
    REQUIRE(CounterValue("duet_kv_transfer_bytes_total", ucx) == bytes_before + kBlock + 1000);
    REQUIRE(seconds->Collect().histogram.sample_count == observed_before + 1);
    REQUIRE(in_flight->Value() == in_flight_before);  // Counted out when it ended.
    // Collected once: a second look finds nothing.
    REQUIRE(t.Poll(*id)->detail.find("unknown transfer") != std::string::npos);
  }

  SECTION("a bumped epoch ends the pull as lease expired") {
    const Labels expired = {{"transport", "ucx"}, {"reason", "lease_expired"}};
    double failures_before = CounterValue("duet_kv_transfer_failures_total", expired);
    REQUIRE(t.BlockEpoch(*src_region, 5) == 0);
    t.BumpEpoch(*src_region, 5);
    REQUIRE(t.BlockEpoch(*src_region, 5) == 1);
    TransferResult r = t.Wait(*t.Pull(req));
    REQUIRE(r.state == TransferState::kLeaseExpired);
    REQUIRE(r.detail.find("block 5 is at epoch 1") != std::string::npos);
    REQUIRE(dst.data[0] == kFill);  // found before any data was read
    REQUIRE(CounterValue("duet_kv_transfer_failures_total", expired) == failures_before + 1);
    // Promising the new epoch works again.
    req.block_epochs = {{3, 0}, {5, 1}};
    REQUIRE(t.Wait(*t.Pull(req)).state == TransferState::kDone);
  }

  SECTION("a pull without epochs skips the lease check") {
    t.BumpEpoch(*src_region, 3);
    req.block_epochs.clear();
    REQUIRE(t.Wait(*t.Pull(req)).state == TransferState::kDone);
  }

  SECTION("a zero timeout ends as timed out without reading") {
    req.timeout = absl::ZeroDuration();
    auto id = t.Pull(req);
    REQUIRE(id.ok());
    TransferResult r = t.Wait(*id);
    REQUIRE(r.state == TransferState::kTimedOut);
    REQUIRE(dst.data[0] == kFill);
  }

  SECTION("a deregistered region's stale handle is lease expired") {
    REQUIRE(t.DeregisterRegion(*src_region).ok());
    REQUIRE(t.Wait(*t.Pull(req)).state == TransferState::kLeaseExpired);
    REQUIRE(t.DeregisterRegion(*src_region).code() == absl::StatusCode::kNotFound);
  }

  SECTION("malformed requests are InvalidArgument") {
    auto code = [&](const PullRequest& r) { return t.Pull(r).status().code(); };
    PullRequest bad = req;
    bad.peer = 999;
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.local_region = 999;
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.segments.push_back({0, dst.bytes - 10, 11});  // past the local end
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.segments.push_back({src.bytes - 10, 0, 11});  // past the remote end
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.segments.push_back({~uint64_t{0} - 4, 0, 10});  // overflow
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.block_epochs.push_back({kBlocks, 0});
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad.block_epochs.back().first = -1;
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    for (size_t cut : {size_t{0}, size_t{3}, size_t{20}, exported->size() - 1}) {
      bad = req;
      bad.remote_region = exported->substr(0, cut);
      REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    }
    bad = req;
    bad.remote_region[4] = 9;  // version
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = req;
    bad.remote_region += "x";  // trailing bytes
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);

    REQUIRE(t.Connect("").status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(t.Connect("not an address").status().code() == absl::StatusCode::kInvalidArgument);
    std::string truncated = t.address().substr(0, t.address().size() - 1);
    REQUIRE(t.Connect(truncated).status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(t.RegisterRegion(nullptr, 10, 0).status().code() ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(t.RegisterRegion(src.data, 0, 0).status().code() ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(t.ExportRegion(999).status().code() == absl::StatusCode::kNotFound);
  }

  SECTION("after Disconnect the peer id is gone and Connect makes a new endpoint") {
    t.Disconnect(*peer);
    REQUIRE(t.Pull(req).status().code() == absl::StatusCode::kInvalidArgument);
    auto again = t.Connect(t.address());
    REQUIRE(again.ok());
    REQUIRE(*again != *peer);
    req.peer = *again;
    REQUIRE(t.Wait(*t.Pull(req)).state == TransferState::kDone);
  }

  SECTION("Cancel after the end changes nothing; Wait of an unknown id says so") {
    auto id = t.Pull(req);
    TransferResult r = t.Wait(*id);
    REQUIRE(r.state == TransferState::kDone);
    t.Cancel(*id);
    REQUIRE(t.Wait(*id).detail.find("unknown transfer") != std::string::npos);
  }
}

// The pool shape of the multi-process test: a block is
// [layer][K|V][head][slot][head_dim] of F32, as in DESIGN.md.
ShardLayout PeerShard(int64_t head_begin, int64_t head_end) {
  ShardLayout s;
  s.num_layers_total = 4;
  s.layer_begin = 0;
  s.layer_end = 4;
  s.num_kv_heads_total = 4;
  s.head_begin = head_begin;
  s.head_end = head_end;
  s.block_size = 16;
  s.head_dim = 8;
  s.dtype_bytes = 4;
  return s;
}

TEST_CASE("1,000 random pulls from an exporter process, every byte checked", "[ucx][process]") {
  const ShardLayout shard = PeerShard(0, 4);
  const uint64_t block_bytes = shard.BlockBytes();  // 16 KiB
  constexpr int32_t kPeerBlocks = 512;
  constexpr int32_t kLocalBlocks = 256;
  constexpr uint64_t kSeed = 42;
  auto peer = StartKvPeer(kPeerBlocks, block_bytes, kSeed);
  REQUIRE(peer.ok());

  UcxTransportOptions options;
  // Sleeping on the event fd after every event, and polling a while first;
  // on the same-host lane, pulls of 1 MiB and more (64 whole blocks) copied
  // by three threads, and by the waiter alone.
  auto [spin_us, copy_threads] = GENERATE(std::pair<int, int>{0, 3}, std::pair<int, int>{50, 1});
  options.spin_window = absl::Microseconds(spin_us);
  options.same_host_copy_threads = copy_threads;
  auto made = NewUcxTransport(options);
  REQUIRE(made.ok());
  KvTransport& t = **made;
  Pool dst(block_bytes * kLocalBlocks);
  auto dst_region = t.RegisterRegion(dst.data, dst.bytes, 0);
  REQUIRE(dst_region.ok());
  auto p = t.Connect(peer->address);
  REQUIRE(p.ok());

  std::mt19937_64 rng(20240601);
  auto uniform = [&](uint64_t lo, uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  auto distinct = [&](int count, int32_t n) {
    std::vector<int32_t> all(n);
    for (int32_t i = 0; i < n; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(count);
    return all;
  };
  uint64_t total_bytes = 0;
  int planned = 0;
  int large = 0;  // pulls of 1 MiB or more
  for (int pull = 0; pull < 1000; ++pull) {
    int count = static_cast<int>(uniform(1, 160));
    std::vector<int32_t> src_blocks = distinct(count, kPeerBlocks);
    std::vector<int32_t> dst_blocks = distinct(count, kLocalBlocks);
    std::vector<Segment> segments;
    if (uniform(0, 3) == 0) {
      // A tensor-parallel split as layout.h plans it: this importer holds
      // half of the exporter's heads, in half-size blocks.
      int half = static_cast<int>(uniform(0, 1));
      auto plans = PlanTransfer({shard}, {PeerShard(0, 2), PeerShard(2, 4)}, {src_blocks},
                                {dst_blocks, dst_blocks});
      INFO(plans.status());
      REQUIRE(plans.ok());
      REQUIRE(plans->size() == 2);
      REQUIRE((*plans)[half].dst_shard == half);
      segments = (*plans)[half].segments;
      ++planned;
    } else {
      for (int i = 0; i < count; ++i) {
        uint64_t src = static_cast<uint64_t>(src_blocks[i]) * block_bytes;
        uint64_t dstb = static_cast<uint64_t>(dst_blocks[i]) * block_bytes;
        switch (uniform(0, 2)) {
          case 0:  // the whole block
            segments.push_back({src, dstb, block_bytes});
            break;
          case 1: {  // any byte range of it
            uint64_t a = uniform(0, block_bytes - 1);
            uint64_t b = uniform(a + 1, block_bytes);
            segments.push_back({src + a, dstb + a, b - a});
            break;
          }
          default: {  // a head range of every layer's K and V
            uint64_t h0 = uniform(0, 3), h1 = uniform(h0 + 1, 4);
            for (int64_t layer = 0; layer < shard.num_layers(); ++layer) {
              for (uint64_t kv = 0; kv < 2; ++kv) {
                uint64_t off = layer * shard.LayerBytes() + kv * shard.KvBytes() +
                               h0 * shard.HeadBytes();
                segments.push_back({src + off, dstb + off, (h1 - h0) * shard.HeadBytes()});
              }
            }
          }
        }
      }
    }
    PullRequest req;
    req.peer = *p;
    req.remote_region = peer->region;
    req.local_region = *dst_region;
    req.segments = segments;
    for (int32_t b : src_blocks) req.block_epochs.push_back({b, 0});
    auto id = t.Pull(req);
    REQUIRE(id.ok());
    TransferResult r = t.Wait(*id);
    INFO("pull " << pull << ": " << TransferStateName(r.state) << " " << r.detail);
    REQUIRE(r.state == TransferState::kDone);
    uint64_t want = 0;
    for (const Segment& s : segments) want += s.length;
    REQUIRE(r.bytes == want);
    total_bytes += want;
    if (want >= (1u << 20)) ++large;
    REQUIRE(CheckSegments(dst.data, segments, kSeed, block_bytes, 0) == "");
    for (const Segment& s : segments) std::memset(dst.data + s.dst_offset, kFill, s.length);
    if (pull % 100 == 99) {
      // Nothing was written outside the segments.
      for (uint64_t i = 0; i < dst.bytes; ++i) {
        if (dst.data[i] != kFill) FAIL("stray byte at " << i);
      }
    }
  }
  REQUIRE(planned > 100);
  REQUIRE(large > 100);
  REQUIRE(total_bytes > 0);
  REQUIRE(peer->process->Call("quit").value() == "bye");
  peer->process->Wait();
}

// This process's TCP sockets with SO_KEEPALIVE on, each with its
// TCP_USER_TIMEOUT in milliseconds.
std::map<int, unsigned> KeepaliveSocketTimeouts() {
  std::map<int, unsigned> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::atoi(e.path().filename().c_str());
    int on = 0;
    unsigned timeout = 0;
    socklen_t len = sizeof(on);
    if (getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len) != 0 || on == 0) continue;
    len = sizeof(timeout);
    if (getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, &len) == 0) out[fd] = timeout;
  }
  return out;
}

TEST_CASE("with UCX_TLS=tcp, UCX's sockets get a user timeout of their keepalive bound, and no other socket does",
          "[ucx][process]") {
  const char* tls = std::getenv("UCX_TLS");
  const bool tcp_only = tls != nullptr && std::string(tls) == "tcp";
  // A socket of this process's own, connected on loopback, without keepalive.
  int listener = socket(AF_INET, SOCK_STREAM, 0), own = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  REQUIRE(own >= 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(listen(listener, 1) == 0);
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&a), &alen) == 0);
  REQUIRE(connect(own, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);

  auto peer = StartKvPeer(8, 4096, 7);
  REQUIRE(peer.ok());
  UcxTransportOptions options;  // keepalive 1 s idle, 1 s apart, 3 probes: 4 s
  auto made = NewUcxTransport(options);
  REQUIRE(made.ok());
  KvTransport& t = **made;
  Pool dst(4096 * 8);
  auto dst_region = t.RegisterRegion(dst.data, dst.bytes, 0);
  REQUIRE(dst_region.ok());
  auto p = t.Connect(peer->address);
  REQUIRE(p.ok());
  PullRequest req{.peer = *p, .remote_region = peer->region, .local_region = *dst_region,
                  .segments = {{0, 0, 4096 * 8}}, .block_epochs = {{0, 0}}};
  auto id = t.Pull(req);
  REQUIRE(id.ok());
  REQUIRE(t.Wait(*id).state == TransferState::kDone);
  if (tcp_only) {
    // Sockets UCX accepts are bounded by its progress thread within 250 ms.
    std::map<int, unsigned> timeouts;
    for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
      timeouts = KeepaliveSocketTimeouts();
      if (std::all_of(timeouts.begin(), timeouts.end(), [](const auto& e) { return e.second != 0; })) break;
      std::this_thread::yield();
    }
    REQUIRE(!timeouts.empty());
    for (const auto& [fd, timeout] : timeouts) {
      INFO("socket " << fd);
      CHECK(timeout == 4000);
    }
  } else {
    for (const auto& [fd, timeout] : KeepaliveSocketTimeouts()) {
      INFO("socket " << fd);
      CHECK(timeout == 0);
    }
  }
  unsigned own_timeout = 1;
  socklen_t len = sizeof(own_timeout);
  REQUIRE(getsockopt(own, IPPROTO_TCP, TCP_USER_TIMEOUT, &own_timeout, &len) == 0);
  CHECK(own_timeout == 0);
  close(own);
  close(listener);
  REQUIRE(peer->process->Call("quit").value() == "bye");
  peer->process->Wait();
}

}  // namespace
}  // namespace duet::kvtransfer

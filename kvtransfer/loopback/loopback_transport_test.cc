#include "kvtransfer/loopback/loopback_transport.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "base/metrics.h"

namespace duet::kvtransfer {
namespace {

constexpr uint64_t kBlock = 256;
constexpr int32_t kBlocks = 8;

struct Fixture {
  explicit Fixture(LoopbackOptions importer_options = {})
      : exporter(NewLoopbackTransport()), importer(NewLoopbackTransport(std::move(importer_options))) {
    src.resize(kBlock * kBlocks);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + i / kBlock);
    dst.assign(kBlock * kBlocks, 0);
    src_region = exporter->RegisterRegion(src.data(), src.size(), kBlocks).value();
    dst_region = importer->RegisterRegion(dst.data(), dst.size(), 0).value();
    peer = importer->Connect(exporter->address()).value();
    req.peer = peer;
    req.remote_region = exporter->ExportRegion(src_region).value();
    req.local_region = dst_region;
    req.segments = {{2 * kBlock, 0, kBlock}, {5 * kBlock + 3, kBlock + 3, 100}};
    req.block_epochs = {{2, 0}, {5, 0}};
  }
  bool Copied() const {
    return std::memcmp(&dst[0], &src[2 * kBlock], kBlock) == 0 &&
           std::memcmp(&dst[kBlock + 3], &src[5 * kBlock + 3], 100) == 0 && dst[kBlock + 2] == 0 &&
           dst[kBlock + 103] == 0;
  }
  KvTransportPtr exporter, importer;
  std::vector<uint8_t> src, dst;
  RegionId src_region, dst_region;
  PeerId peer;
  PullRequest req;
};

TEST_CASE("loopback pulls copy the segments and account them", "[loopback]") {
  Fixture f;
  REQUIRE(f.importer->Name() == "loopback");
  REQUIRE(f.exporter->address() != f.importer->address());
  Counter* bytes = MetricsRegistry::Default().GetCounter("duet_kv_transfer_bytes_total", "",
                                                         {{"transport", "loopback"}});
  double before = bytes->Value();
  TransferId id = f.importer->Pull(f.req).value();
  std::optional<TransferResult> r = f.importer->Poll(id);
  REQUIRE(r.has_value());
  REQUIRE(r->state == TransferState::kDone);
  REQUIRE(r->bytes == kBlock + 100);
  REQUIRE(f.Copied());
  REQUIRE(bytes->Value() == before + kBlock + 100);
  // Collected once.
  REQUIRE(f.importer->Wait(id).detail.find("unknown transfer") != std::string::npos);
  // Same address, same peer.
  REQUIRE(f.importer->Connect(f.exporter->address()).value() == f.peer);
}

TEST_CASE("loopback leases: a bump before or during a pull is lease expired", "[loopback]") {
  SECTION("before") {
    Fixture f;
    f.exporter->BumpEpoch(f.src_region, 5);
    REQUIRE(f.exporter->BlockEpoch(f.src_region, 5) == 1);
    TransferResult r = f.importer->Wait(f.importer->Pull(f.req).value());
    REQUIRE(r.state == TransferState::kLeaseExpired);
    REQUIRE(r.detail.find("before") != std::string::npos);
    REQUIRE(f.dst[0] == 0);
    f.req.block_epochs = {{2, 0}, {5, 1}};
    REQUIRE(f.importer->Wait(f.importer->Pull(f.req).value()).state == TransferState::kDone);
  }
  SECTION("during") {
    KvTransport* exporter = nullptr;
    RegionId region = 0;
    LoopbackOptions o;
    o.during_pull = [&] { exporter->BumpEpoch(region, 2); };
    Fixture f(o);
    exporter = f.exporter.get();
    region = f.src_region;
    TransferResult r = f.importer->Wait(f.importer->Pull(f.req).value());
    REQUIRE(r.state == TransferState::kLeaseExpired);
    REQUIRE(r.detail.find("block 2 is at epoch 1") != std::string::npos);
    REQUIRE(r.detail.find("during") != std::string::npos);
  }
  SECTION("no promised epochs: no check") {
    Fixture f;
    f.exporter->BumpEpoch(f.src_region, 2);
    f.req.block_epochs.clear();
    REQUIRE(f.importer->Wait(f.importer->Pull(f.req).value()).state == TransferState::kDone);
  }
  SECTION("a deregistered region's stale handle") {
    Fixture f;
    REQUIRE(f.exporter->DeregisterRegion(f.src_region).ok());
    REQUIRE(f.importer->Wait(f.importer->Pull(f.req).value()).state ==
            TransferState::kLeaseExpired);
    REQUIRE(f.exporter->DeregisterRegion(f.src_region).code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("loopback failures: dead peer, timeout, bad requests", "[loopback]") {
  Fixture f;
  SECTION("the exporter's transport is gone") {
    std::string address = f.exporter->address();
    f.exporter.reset();
    REQUIRE(f.importer->Wait(f.importer->Pull(f.req).value()).state == TransferState::kPeerLost);
    REQUIRE(f.importer->Connect(address).status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("a zero timeout") {
    f.req.timeout = absl::ZeroDuration();
    REQUIRE(f.importer->Wait(f.importer->Pull(f.req).value()).state == TransferState::kTimedOut);
  }
  SECTION("malformed requests") {
    auto code = [&](const PullRequest& r) { return f.importer->Pull(r).status().code(); };
    PullRequest bad = f.req;
    bad.peer = 77;
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.local_region = 77;
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.segments.push_back({0, kBlock * kBlocks - 1, 2});
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.segments.push_back({kBlock * kBlocks - 1, 0, 2});
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.block_epochs.push_back({kBlocks, 0});
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.remote_region.pop_back();
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    bad = f.req;
    bad.remote_region = f.importer->ExportRegion(f.dst_region).value();  // not the peer's
    REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
    REQUIRE(f.importer->Connect("loopback:nope").status().code() ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(f.importer->RegisterRegion(nullptr, 1, 0).status().code() ==
            absl::StatusCode::kInvalidArgument);
  }
  SECTION("after Disconnect the peer id is unknown") {
    f.importer->Disconnect(f.peer);
    REQUIRE(f.importer->Pull(f.req).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("loopback pulls in both directions from many threads", "[loopback]") {
  Fixture f;
  // The exporter also pulls from the importer's region.
  PeerId back = f.exporter->Connect(f.importer->address()).value();
  std::vector<uint8_t> scratch(kBlock * kBlocks);
  RegionId scratch_region = f.exporter->RegisterRegion(scratch.data(), scratch.size(), 0).value();
  PullRequest back_req;
  back_req.peer = back;
  back_req.remote_region = f.importer->ExportRegion(f.dst_region).value();
  back_req.local_region = scratch_region;
  back_req.segments = {{0, 0, kBlock}};
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < 200; ++n) {
        KvTransport& t = i % 2 ? *f.importer : *f.exporter;
        const PullRequest& r = i % 2 ? f.req : back_req;
        if (t.Wait(t.Pull(r).value()).state == TransferState::kDone) done++;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(done == 800);
  REQUIRE(f.Copied());
}

}  // namespace
}  // namespace duet::kvtransfer

// CUDA IPC transport against a second process (kvtransfer/testing/gpu_peer)
// on the same GPU: random block sets checked byte for byte, leases, malformed requests,
// cancel and peer loss, and the bandwidth of a 64 MiB pull beside plain
// cudaMemcpy device-to-device measured in the same run. Needs a device:
// without one every case fails with CUDA's error string.
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvtransfer/testing/gpu_fixture.h"
#include "kvtransfer/testing/pattern.h"

namespace duet::kvtransfer::testing {
namespace {

constexpr int64_t kBlocks = 256;
constexpr int64_t kBlockBytes = 256 * 1024;  // 64 MiB pool.
constexpr uint64_t kPoolBytes = kBlocks * kBlockBytes;
constexpr uint64_t kSeed = 20241130;
constexpr int64_t kPeerOffset = 4096;  // The pool starts inside its allocation.

// Fails, never skips, without a device.
void RequireCudaDevice() {
  RequireDevices(1, "cuda_ipc_test needs a CUDA device");
  RequireCuda(cudaSetDevice(0));
}

Exporter StartCudaIpcExporter() {
  return StartExporter({"--transport=cuda_ipc", absl::StrCat("--blocks=", kBlocks),
                        absl::StrCat("--block-bytes=", kBlockBytes), absl::StrCat("--seed=", kSeed),
                        absl::StrCat("--offset=", kPeerOffset)});
}

KvTransportPtr NewTransport() {
  absl::StatusOr<KvTransportPtr> t = NewCudaIpcTransport({.device = 0});
  RequireOk(t.status());
  return *std::move(t);
}

TEST_CASE("cuda_ipc pulls random block sets from another process", "[gpu]") {
  RequireCudaDevice();
  Exporter exporter = StartCudaIpcExporter();
  KvTransportPtr t = NewTransport();
  DeviceBuffer dst(kPoolBytes);
  absl::StatusOr<RegionId> local = t->RegisterRegion(dst.get(), dst.bytes(), 0);
  RequireOk(local.status());
  absl::StatusOr<PeerId> peer = t->Connect(exporter.address);
  RequireOk(peer.status());

  std::mt19937 rng(7);
  std::vector<int32_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  for (int round = 0; round < 8; ++round) {
    dst.Fill(0xAB);
    std::vector<int32_t> src = ids, dsts = ids;
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dsts.begin(), dsts.end(), rng);
    const int n = 1 + static_cast<int>(rng() % 48);
    PullRequest request;
    request.peer = *peer;
    request.remote_region = exporter.region;
    request.local_region = *local;
    for (int i = 0; i < n; ++i) {
      request.segments.push_back({static_cast<uint64_t>(src[i]) * kBlockBytes,
                                  static_cast<uint64_t>(dsts[i]) * kBlockBytes,
                                  static_cast<uint64_t>(kBlockBytes)});
      request.block_epochs.emplace_back(src[i], 0);
    }
    TransferResult r = PullAndWait(*t, request);
    RequireState(r, TransferState::kDone);
    REQUIRE(r.bytes == static_cast<uint64_t>(n) * kBlockBytes);
    for (int i = 0; i < n; ++i) RequireBlock(dst, dsts[i], src[i], kSeed, kBlockBytes);
    RequireUntouched(dst, dsts[n], 0xAB, kBlockBytes);  // One block nobody wrote.
  }

  SECTION("sub-block segments land at their byte offsets") {
    dst.Fill(0);
    PullRequest request;
    request.peer = *peer;
    request.remote_region = exporter.region;
    request.local_region = *local;
    request.segments = {{kBlockBytes * 3 + 1024, 40, 4096}};
    RequireState(PullAndWait(*t, request), TransferState::kDone);
    std::vector<uint32_t> got = dst.Words(40, 4096);
    REQUIRE(got == PoolWords(kSeed, (kBlockBytes * 3 + 1024) / 4, 1024));
  }
}

TEST_CASE("cuda_ipc ends a pull whose lease ended as lease expired", "[gpu]") {
  RequireCudaDevice();
  Exporter exporter = StartCudaIpcExporter();
  KvTransportPtr t = NewTransport();
  DeviceBuffer dst(kPoolBytes);
  dst.Fill(0x5C);
  RegionId local = t->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  PeerId peer = t->Connect(exporter.address).value();

  REQUIRE(Command(*exporter.process, "BUMP 5") == "OK 1");
  PullRequest request;
  request.peer = peer;
  request.remote_region = exporter.region;
  request.local_region = local;
  request.segments = {{5 * kBlockBytes, 0, kBlockBytes},
                      {6 * kBlockBytes, kBlockBytes, kBlockBytes}};
  request.block_epochs = {{5, 0}, {6, 0}};  // The handle promised epoch 0 for block 5.
  RequireState(PullAndWait(*t, request), TransferState::kLeaseExpired);
  RequireUntouched(dst, 0, 0x5C, kBlockBytes);  // Refused before any byte moved.
  RequireUntouched(dst, 1, 0x5C, kBlockBytes);

  request.block_epochs = {{5, 1}, {6, 0}};  // A handle issued after the bump.
  RequireState(PullAndWait(*t, request), TransferState::kDone);
  RequireBlock(dst, 0, 5, kSeed, kBlockBytes);
  RequireBlock(dst, 1, 6, kSeed, kBlockBytes);
  REQUIRE(Command(*exporter.process, "EPOCH 6") == "OK 0");
}

TEST_CASE("cuda_ipc refuses malformed requests", "[gpu]") {
  RequireCudaDevice();
  Exporter exporter = StartCudaIpcExporter();
  KvTransportPtr t = NewTransport();
  DeviceBuffer dst(kBlockBytes * 4);
  RegionId local = t->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  PeerId peer = t->Connect(exporter.address).value();
  PullRequest good;
  good.peer = peer;
  good.remote_region = exporter.region;
  good.local_region = local;
  good.segments = {{0, 0, kBlockBytes}};
  RequireState(PullAndWait(*t, good), TransferState::kDone);

  auto code = [&](const PullRequest& r) { return t->Pull(r).status().code(); };
  PullRequest bad = good;
  bad.segments = {{kPoolBytes - 8, 0, 16}};  // Past the remote region.
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad.segments = {{0, kBlockBytes * 4 - 8, 16}};  // Past the local region.
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad.segments = {{UINT64_MAX - 4, 0, 16}};  // Offset + length overflows.
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.block_epochs = {{static_cast<int32_t>(kBlocks), 0}};
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.peer = peer + 100;
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.local_region = local + 100;
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.remote_region = exporter.region.substr(0, exporter.region.size() - 1);
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);

  // A descriptor of another exporter than the peer named.
  KvTransportPtr other = NewTransport();
  DeviceBuffer other_pool(kBlockBytes);
  RegionId other_region = other->RegisterRegion(other_pool.get(), other_pool.bytes(), 1).value();
  bad = good;
  bad.remote_region = other->ExportRegion(other_region).value();
  REQUIRE(code(bad) == absl::StatusCode::kInvalidArgument);

  REQUIRE(t->Connect("not an address").status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> host(64);
  REQUIRE(t->RegisterRegion(host.data(), host.size(), 0).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cuda_ipc cancels, and reports an exporter that exited as peer lost", "[gpu]") {
  RequireCudaDevice();
  Exporter exporter = StartCudaIpcExporter();
  KvTransportPtr t = NewTransport();
  DeviceBuffer dst(kPoolBytes);
  RegionId local = t->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  PeerId peer = t->Connect(exporter.address).value();
  PullRequest request;
  request.peer = peer;
  request.remote_region = exporter.region;
  request.local_region = local;
  request.segments = {{0, 0, kPoolBytes}};

  absl::StatusOr<TransferId> id = t->Pull(request);
  RequireOk(id.status());
  t->Cancel(*id);
  RequireState(t->Wait(*id), TransferState::kCancelled);
  // The copy drained before the terminal state: the region may be released.
  RequireOk(t->DeregisterRegion(local));
  local = t->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  request.local_region = local;

  exporter.process->CloseStdin();
  absl::StatusOr<int> exit_status = exporter.process->WaitFor(absl::Seconds(60));
  RequireOk(exit_status.status());
  REQUIRE(*exit_status == 0);
  RequireState(PullAndWait(*t, request), TransferState::kPeerLost);
  REQUIRE(t->Connect(exporter.address).status().code() == absl::StatusCode::kUnavailable);
  t->Disconnect(peer);
  REQUIRE(t->Pull(request).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cuda_ipc pulls within one process too", "[gpu]") {
  RequireCudaDevice();
  KvTransportPtr exporter = NewTransport();
  KvTransportPtr importer = NewTransport();
  DeviceBuffer src(kBlockBytes * 4);
  std::vector<uint32_t> pattern = PoolWords(kSeed, 0, src.bytes() / 4);
  RequireCuda(cudaMemcpy(src.get(), pattern.data(), src.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer dst(kBlockBytes * 4);
  RegionId exported = exporter->RegisterRegion(src.get(), src.bytes(), 4).value();
  RegionId local = importer->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  PeerId peer = importer->Connect(exporter->address()).value();
  PullRequest request;
  request.peer = peer;
  request.remote_region = exporter->ExportRegion(exported).value();
  request.local_region = local;
  request.segments = {{0, 2 * kBlockBytes, kBlockBytes}};
  request.block_epochs = {{0, exporter->BlockEpoch(exported, 0)}};
  RequireState(PullAndWait(*importer, request), TransferState::kDone);
  REQUIRE(dst.Words(2 * kBlockBytes, kBlockBytes) ==
          std::vector<uint32_t>(pattern.begin(), pattern.begin() + kBlockBytes / 4));
  exporter->BumpEpoch(exported, 0);
  RequireState(PullAndWait(*importer, request), TransferState::kLeaseExpired);
}

TEST_CASE("cuda_ipc bandwidth of a 64 MiB pull beside cudaMemcpy device-to-device", "[gpu]") {
  RequireCudaDevice();
  Exporter exporter = StartCudaIpcExporter();
  KvTransportPtr t = NewTransport();
  DeviceBuffer dst(kPoolBytes);
  RegionId local = t->RegisterRegion(dst.get(), dst.bytes(), 0).value();
  PeerId peer = t->Connect(exporter.address).value();
  PullRequest request;
  request.peer = peer;
  request.remote_region = exporter.region;
  request.local_region = local;
  request.segments = {{0, 0, kPoolBytes}};
  constexpr int kWarmup = 3, kReps = 20;
  QueuedPullSeconds(*t, request, kWarmup);
  const double pull_s = QueuedPullSeconds(*t, request, kReps);
  RequireBlock(dst, 0, 0, kSeed, kBlockBytes);
  RequireBlock(dst, kBlocks - 1, kBlocks - 1, kSeed, kBlockBytes);
  DeviceMemcpySeconds(kPoolBytes, kWarmup);
  const double memcpy_s = DeviceMemcpySeconds(kPoolBytes, kReps);

  const Bandwidth bw = PrintBandwidth("cuda_ipc Pull from another process",
                                      "cudaMemcpyAsync device-to-device, this process", kReps, kPoolBytes, pull_s,
                                      memcpy_s);
  // Same copy engine on the same device: far below this means the pull went
  // through the host or serialised on something it should not.
  REQUIRE(bw.pull_gbps >= 0.1 * bw.memcpy_gbps);
}

}  // namespace
}  // namespace duet::kvtransfer::testing

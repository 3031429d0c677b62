#include "kvtransfer/testing/gpu_fixture.h"

#include <algorithm>
#include <cstdio>
#include <catch2/catch.hpp>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "absl/strings/str_split.h"
#include "base/cuda_status.h"
#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/testing/peer_process.h"

namespace duet::kvtransfer::testing {

void RequireOk(const absl::Status& status) {
  INFO(status.ToString());
  REQUIRE(status.ok());
}

void RequireCuda(cudaError_t err) {
  INFO("CUDA: " << CudaErrorText(err));
  REQUIRE(err == cudaSuccess);
}

void RequireDevices(int count, const std::string& need) {
  int found = 0;
  cudaError_t err = cudaGetDeviceCount(&found);
  INFO(need << "; cudaGetDeviceCount: " << CudaErrorText(err) << ", devices: " << found);
  REQUIRE(err == cudaSuccess);
  if (found < count) FAIL(need << ": found " << found << " device(s)");
}

DeviceBuffer::DeviceBuffer(uint64_t bytes) : bytes_(bytes) { RequireCuda(cudaMalloc(&ptr_, bytes)); }

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

void DeviceBuffer::Fill(uint8_t byte) { RequireCuda(cudaMemset(ptr_, byte, bytes_)); }

std::vector<uint32_t> DeviceBuffer::Words(uint64_t offset, uint64_t bytes) const {
  std::vector<uint32_t> host(bytes / 4);
  RequireCuda(cudaMemcpy(host.data(), get() + offset, bytes, cudaMemcpyDeviceToHost));
  return host;
}

Exporter StartExporter(const std::vector<std::string>& args) {
  absl::StatusOr<std::string> path = FindPeerBinary("DUET_GPU_PEER", "kvtransfer/testing/gpu_peer");
  RequireOk(path.status());
  std::vector<std::string> argv = {*path};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::StartWithPipes(argv);
  RequireOk(process.status());
  absl::StatusOr<std::string> line = (*process)->ReadLine(absl::Seconds(120));
  RequireOk(line.status());
  INFO("peer said: " << *line);
  std::vector<std::string> parts = absl::StrSplit(*line, ' ');
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[0] == "READY");
  return {*std::move(process), absl::HexStringToBytes(parts[1]), absl::HexStringToBytes(parts[2])};
}

std::string Command(Subprocess& peer, const std::string& command) {
  absl::StatusOr<std::string> reply = peer.Call(command, absl::Seconds(30));
  RequireOk(reply.status());
  return *reply;
}

TransferResult PullAndWait(KvTransport& t, const PullRequest& request) {
  absl::StatusOr<TransferId> id = t.Pull(request);
  RequireOk(id.status());
  return t.Wait(*id);
}

void RequireState(const TransferResult& r, TransferState want) {
  INFO("state " << TransferStateName(r.state) << " (want " << TransferStateName(want) << "): " << r.detail);
  REQUIRE(r.state == want);
}

void RequireBlock(const DeviceBuffer& pool, int64_t dst, int64_t src, uint64_t seed, int64_t block_bytes) {
  std::vector<uint32_t> got = pool.Words(dst * block_bytes, block_bytes);
  INFO("destination block " << dst << " should hold exporter block " << src);
  REQUIRE(got == PoolWords(seed, src * block_bytes / 4, block_bytes / 4));
}

void RequireUntouched(const DeviceBuffer& pool, int64_t dst, uint8_t fill, int64_t block_bytes) {
  std::vector<uint32_t> got = pool.Words(dst * block_bytes, block_bytes);
  INFO("destination block " << dst << " must not have been written");
  REQUIRE(std::all_of(got.begin(), got.end(), [&](uint32_t w) { return w == fill * 0x01010101u; }));
}

double QueuedPullSeconds(KvTransport& t, const PullRequest& request, int reps) {
  absl::Time start = absl::Now();
  std::vector<TransferId> ids;
  for (int i = 0; i < reps; ++i) {
    absl::StatusOr<TransferId> id = t.Pull(request);
    RequireOk(id.status());
    ids.push_back(*id);
  }
  for (TransferId id : ids) RequireState(t.Wait(id), TransferState::kDone);
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double DeviceMemcpySeconds(uint64_t bytes, int reps) {
  DeviceBuffer a(bytes), b(bytes);
  cudaStream_t stream;
  RequireCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::Time start = absl::Now();
  for (int i = 0; i < reps; ++i) {
    RequireCuda(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  }
  RequireCuda(cudaStreamSynchronize(stream));
  const double s = absl::ToDoubleSeconds(absl::Now() - start);
  cudaStreamDestroy(stream);
  return s;
}

Bandwidth PrintBandwidth(const std::string& pull_row, const std::string& memcpy_row, int reps, uint64_t bytes,
                         double pull_s, double memcpy_s) {
  const double gb = static_cast<double>(bytes) * reps / 1e9;
  const Bandwidth b{.pull_gbps = gb / pull_s, .memcpy_gbps = gb / memcpy_s};
  std::printf(
      "\n| copy, %.0f MiB x %d (bytes copied / wall time) | GB/s | vs cudaMemcpy |\n"
      "|---|---|---|\n"
      "| %s | %.1f | %.2f |\n"
      "| %s | %.1f | 1.00 |\n\n",
      static_cast<double>(bytes) / (1 << 20), reps, pull_row.c_str(), b.pull_gbps, b.pull_gbps / b.memcpy_gbps,
      memcpy_row.c_str(), b.memcpy_gbps);
  std::fflush(stdout);
  return b;
}

}  // namespace duet::kvtransfer::testing

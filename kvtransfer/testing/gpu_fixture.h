// What the GPU transport tests (cuda_ipc_test, nccl_test) share: Catch2
// checks of CUDA and Status results, a device buffer, the exporter process
// (kvtransfer/testing/gpu_peer) and checks of pulled blocks against the
// exporter's pattern (pattern.h's PoolWords). Built only under --config=cuda.
//
//   RequireDevices(1, "cuda_ipc_test needs a CUDA device");
//   Exporter e = StartExporter({"--transport=cuda_ipc", "--blocks=256", "--seed=7"});
//   DeviceBuffer dst(bytes);
//   RequireState(PullAndWait(*t, request), TransferState::kDone);
//   RequireBlock(dst, /*dst=*/0, /*src=*/5, /*seed=*/7, block_bytes);
//
// Test-only; one test thread.
#ifndef DUET_KVTRANSFER_TESTING_GPU_FIXTURE_H_
#define DUET_KVTRANSFER_TESTING_GPU_FIXTURE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/subprocess.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer::testing {

void RequireOk(const absl::Status& status);
void RequireCuda(cudaError_t err);
// Fails, never skips (STYLE.md rule 8), unless at least `count` devices are
// visible; `need` says what the test needs them for.
void RequireDevices(int count, const std::string& need);

class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  uint64_t bytes() const { return bytes_; }

  void Fill(uint8_t byte);
  std::vector<uint32_t> Words(uint64_t offset, uint64_t bytes) const;

 private:
  void* ptr_ = nullptr;
  uint64_t bytes_;
};

// A running gpu_peer with the address and region descriptor it printed.
struct Exporter {
  std::unique_ptr<Subprocess> process;
  std::string address;
  std::string region;
};
// gpu_peer with `args` (its flags), once it is READY.
Exporter StartExporter(const std::vector<std::string>& args);
// One command line to the peer and its reply.
std::string Command(Subprocess& peer, const std::string& command);

TransferResult PullAndWait(KvTransport& t, const PullRequest& request);
void RequireState(const TransferResult& r, TransferState want);
// The exporter's block `src` (a pool of `seed`) sits at block `dst` of `pool`.
void RequireBlock(const DeviceBuffer& pool, int64_t dst, int64_t src, uint64_t seed, int64_t block_bytes);
// Block `dst` of `pool` still holds `fill` in every byte.
void RequireUntouched(const DeviceBuffer& pool, int64_t dst, uint8_t fill, int64_t block_bytes);

// The seconds `reps` pulls of `request` take, queued back to back as a decode
// worker pulling many requests would (throughput, not one call's latency).
double QueuedPullSeconds(KvTransport& t, const PullRequest& request, int reps);
// The seconds `reps` cudaMemcpyAsync device-to-device copies of `bytes` take
// on the current device: the reference a pull's bandwidth is compared to.
double DeviceMemcpySeconds(uint64_t bytes, int reps);

struct Bandwidth {
  double pull_gbps = 0;
  double memcpy_gbps = 0;
};
// Prints the table of `reps` copies of `bytes` by a pull (`pull_s`, labelled
// `pull_row`) beside cudaMemcpy's (`memcpy_s`, `memcpy_row`), with the ratio,
// and returns both rates in GB/s.
Bandwidth PrintBandwidth(const std::string& pull_row, const std::string& memcpy_row, int reps, uint64_t bytes,
                         double pull_s, double memcpy_s);

}  // namespace duet::kvtransfer::testing

#endif  // DUET_KVTRANSFER_TESTING_GPU_FIXTURE_H_

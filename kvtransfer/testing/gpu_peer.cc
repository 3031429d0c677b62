// The exporter half of the GPU transport tests (cuda_ipc_test, nccl_test):
// allocates a device pool on --device (--offset bytes into its allocation,
// to test sub-allocation export), fills it with PoolWords(seed, ...),
// registers it with an epoch table on the --transport (cuda_ipc or nccl) and
// prints one line
//   READY <address hex> <region descriptor hex>
// then serves pulls (the transport's own threads) and commands, one per
// stdin line, until QUIT or EOF:
//   BUMP <block>   -> "OK <new epoch>"   (ends the leases on that block)
//   EPOCH <block>  -> "OK <epoch>"
//   ADDRESS        -> "OK <address hex>" (nccl: the next importer's; one per pairing)
// Any failure prints "ERROR <status>" and exits 1.
#include <cuda_runtime_api.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/cuda_status.h"
#include "base/flags.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/testing/pattern.h"

namespace duet::kvtransfer {
namespace {

int Fail(const absl::Status& status) {
  std::cout << "ERROR " << status.ToString() << std::endl;
  return 1;
}

absl::StatusOr<KvTransportPtr> NewTransport(const std::string& kind, int device) {
  if (kind == "cuda_ipc") return NewCudaIpcTransport({.device = device});
  if (kind == "nccl") return NewNcclTransport({.device = device});
  return absl::InvalidArgumentError(absl::StrCat("--transport must be cuda_ipc or nccl, got \"", kind, "\""));
}

int Run(int argc, char** argv) {
  FlagSet flags("gpu_peer", "Exports a filled device pool over a GPU transport (test peer).");
  flags.String("transport", "cuda_ipc", "cuda_ipc | nccl");
  flags.Int("blocks", 64, "blocks in the pool");
  flags.Int("block-bytes", 65536, "bytes per block (a multiple of 4)");
  flags.Int("seed", 1, "pattern seed");
  flags.Int("device", 0, "CUDA device");
  flags.Int("offset", 0, "bytes of the allocation before the pool (tests sub-allocation export)");
  absl::Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed);
  const int64_t blocks = flags.GetInt("blocks");
  const int64_t block_bytes = flags.GetInt("block-bytes");
  const int64_t offset = flags.GetInt("offset");
  if (blocks <= 0 || block_bytes <= 0 || block_bytes % 4 != 0 || offset < 0 || offset % 4 != 0) {
    return Fail(absl::InvalidArgumentError("bad --blocks/--block-bytes/--offset"));
  }
  const uint64_t pool_bytes = static_cast<uint64_t>(blocks * block_bytes);
  const int device = static_cast<int>(flags.GetInt("device"));

  absl::Status status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  if (!status.ok()) return Fail(status);
  void* allocation = nullptr;
  status = CudaStatus(cudaMalloc(&allocation, pool_bytes + offset), "cudaMalloc");
  if (!status.ok()) return Fail(status);
  uint8_t* pool = static_cast<uint8_t*>(allocation) + offset;
  std::vector<uint32_t> host = testing::PoolWords(flags.GetInt("seed"), 0, pool_bytes / 4);
  status = CudaStatus(cudaMemcpy(pool, host.data(), pool_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (!status.ok()) return Fail(status);

  absl::StatusOr<KvTransportPtr> transport = NewTransport(flags.GetString("transport"), device);
  if (!transport.ok()) return Fail(transport.status());
  absl::StatusOr<RegionId> region = (*transport)->RegisterRegion(pool, pool_bytes, blocks);
  if (!region.ok()) return Fail(region.status());
  absl::StatusOr<std::string> descriptor = (*transport)->ExportRegion(*region);
  if (!descriptor.ok()) return Fail(descriptor.status());
  std::cout << "READY " << absl::BytesToHexString((*transport)->address()) << " "
            << absl::BytesToHexString(*descriptor) << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "QUIT") break;
    if (line == "ADDRESS") {
      std::cout << "OK " << absl::BytesToHexString((*transport)->address()) << std::endl;
      continue;
    }
    absl::string_view rest;
    bool bump = line.rfind("BUMP ", 0) == 0;
    bool read = line.rfind("EPOCH ", 0) == 0;
    int32_t block = -1;
    if (bump) rest = absl::string_view(line).substr(5);
    if (read) rest = absl::string_view(line).substr(6);
    if ((!bump && !read) || !absl::SimpleAtoi(rest, &block) || block < 0 || block >= blocks) {
      std::cout << "ERROR bad command: " << line << std::endl;
      continue;
    }
    if (bump) (*transport)->BumpEpoch(*region, block);
    std::cout << "OK " << (*transport)->BlockEpoch(*region, block) << std::endl;
  }
  transport->reset();
  cudaFree(allocation);
  return 0;
}

}  // namespace
}  // namespace duet::kvtransfer

int main(int argc, char** argv) { return duet::kvtransfer::Run(argc, argv); }

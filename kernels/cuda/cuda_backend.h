// The CUDA backend: a KernelBackend whose memory is a CUDA device's and
// whose ops are duet's CUDA kernels (kernels/cuda/*.cu): every op of the
// interface (the GEMM's weights of any dtype widened on the device, then
// the GEMM seam's GEMM, in BF16 or F32; MoE routed on the device, then
// every expert over every row; the collectives through host memory), step
// graphs as CUDA graphs.
//
//   ASSIGN_OR_RETURN(kernels::KernelBackendPtr be, kernels::cuda::NewCudaBackend());
//
// One source, two builds: `cuda_backend` links the kernels nvcc compiled
// and the CUDA runtime (--config=cuda; a GPU), `cuda_backend_simt` the same
// kernels run by the SIMT executor over its emulated runtime (every build;
// what CI runs through the op harness). Buffers are device memory
// (cudaMalloc), reached from the host by cudaMemcpy; ops run in order on
// the backend's stream, and a buffer's copy waits for them. The weights an
// op takes as host memory (weight matrices, biases, RMSNorm's gain, RoPE's
// frequencies) are read from their resident copies (MakeResident: a model
// registers all of its own), any other host array copied to device scratch
// with the op.
#ifndef DUET_KERNELS_CUDA_CUDA_BACKEND_H_
#define DUET_KERNELS_CUDA_CUDA_BACKEND_H_

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace duet::kernels::cuda {

struct CudaBackendOptions {
  // Every GEMM (the MoE experts' too) by the fixed-order kernel
  // (gemm_fixed.cuh) instead of cuBLAS, so a row's bits do not depend on the
  // rows batched with it; the other ops' reductions are in a fixed order in
  // both modes (attention: one warp per query row over its keys in order).
  bool deterministic = false;
  // kBF16: every GEMM's inputs (the activations and the widened weights)
  // rounded to BF16, F32 accumulation (cuBLAS's tensor cores on a GPU), and
  // BF16 the default KV dtype; the residual stream and the other ops stay
  // F32. kF32: F32 throughout (the CPU backend's arithmetic: what tests
  // compare with it). No other dtype.
  DType activation_dtype = DType::kBF16;
};

// Unavailable where no device is visible (the CUDA build without a GPU);
// the SIMT build always has its one emulated device.
absl::StatusOr<KernelBackendPtr> NewCudaBackend(const CudaBackendOptions& options = {});

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_CUDA_BACKEND_H_

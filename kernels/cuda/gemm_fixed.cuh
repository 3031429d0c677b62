// The deterministic mode's GEMM: C[m][n] = A[m][k] B[n][k]^T in F32 (plus
// C where `accumulate`), every output the fma chain over k = 0, 1, ..., k-1
// in that order, whatever m, n or the tile an output falls in. A row's bits
// therefore do not depend on the rows it is batched with (cuBLAS picks its
// algorithm, split-K included, by shape, so its rows do), at a cost: a
// tiled kernel without tensor cores, and a thread-per-output one for few
// rows (kernels/README.md gives it).
//
//   cudaError_t e = LaunchFixedOrderGemm(d_a, d_b, d_c, m, n, k, false, stream);
//
// Row-major, leading dimensions k, k and n; all pointers device memory.
#ifndef DUET_KERNELS_CUDA_GEMM_FIXED_CUH_
#define DUET_KERNELS_CUDA_GEMM_FIXED_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// Enqueues on `stream`; cudaErrorInvalidValue for negative sizes or a grid
// past the launch limits; m == 0 or n == 0 enqueues nothing.
cudaError_t LaunchFixedOrderGemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                                 bool accumulate, cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_GEMM_FIXED_CUH_

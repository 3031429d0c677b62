// RMSNorm on the GPU: the CUDA launcher behind kernels::cuda::RmsNorm.
//
//   cudaError_t err = LaunchRmsNorm(d_x, d_w, d_y, rows, dim, 1e-5f, stream);
//   if (err != cudaSuccess) { /* convert at the package boundary */ }
//
// Matches kernels::ref::RmsNorm: y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) +
// eps) * w, row-major float32, x and y may alias. All pointers are device
// memory. Callers outside kernels/cuda use cuda_ops.h, which turns the
// cudaError_t into absl::Status; this header stays free of abseil because nvcc
// compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_RMS_NORM_CUH_
#define DUET_KERNELS_CUDA_RMS_NORM_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// Enqueues the op on `stream` and returns the launch error; it does not wait.
// Negative sizes or dim == 0 with rows > 0 give cudaErrorInvalidValue;
// rows == 0 enqueues nothing.
cudaError_t LaunchRmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                          float eps, cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_RMS_NORM_CUH_

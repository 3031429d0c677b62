// What the CUDA kernels (.cu files) share, as device code: the grid-stride
// launch shape of the element-wise kernels, and the KV pool's element types
// (a float rounded to one, to nearest even, and widened back exactly).
// Included by .cu files only; free of abseil and of C++20 because nvcc
// compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_DEVICE_CUH_
#define DUET_KERNELS_CUDA_DEVICE_CUH_

#include "kernels/cuda/cuda_compat.h"

#if !defined(DUET_SIMT)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>

namespace duet::kernels::cuda {

// Threads per block of a grid-stride kernel.
inline constexpr int kThreads = 256;
// Enough blocks to fill a large GPU; the threads stride over the rest.
inline constexpr int64_t kMaxBlocks = 4096;

// Blocks for n items at `per_thread` a thread (a grid-stride loop's turns).
inline unsigned BlocksFor(int64_t n, int64_t per_thread = 1) {
  const int64_t b = (n + per_thread * kThreads - 1) / (per_thread * kThreads);
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

// This thread's first item and the stride of a grid-stride loop.
__device__ inline int64_t GridFirst() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t GridStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <typename T>
__device__ T RoundTo(float x);
template <>
__device__ inline float RoundTo<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 RoundTo<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ inline __half RoundTo<__half>(float x) {
  return __float2half(x);
}

template <typename T>
__device__ float Widen(T x);
template <>
__device__ inline float Widen<float>(float x) {
  return x;
}
template <>
__device__ inline float Widen<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ inline float Widen<__half>(__half x) {
  return __half2float(x);
}

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_DEVICE_CUH_

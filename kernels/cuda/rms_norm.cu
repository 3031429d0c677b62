#include "kernels/cuda/rms_norm.cuh"

#include <climits>

namespace duet::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;

// Sum of v over the block, returned to every thread. blockDim.x must be a
// multiple of 32 so that every warp is full for the shuffles.
__device__ float BlockSum(float v) {
  DUET_SHARED(float, partial, kMaxThreads / kWarpSize);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  // Every warp folds the per-warp sums itself, which saves a second barrier
  // and a broadcast through shared memory.
  v = lane < blockDim.x / kWarpSize ? partial[lane] : 0.0f;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// One block per row. x and y may alias: each element is read and written by
// the same thread, and every read of the first pass precedes the barrier.
template <bool kVec4>
__global__ void RmsNormKernel(const float* x, const float* __restrict__ w, float* y, int64_t dim,
                              float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  if constexpr (kVec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  }
  // A true division and sqrt, not rsqrtf: this runs once per row, and the
  // reference is exact.
  const float inv = 1.0f / sqrtf(BlockSum(ss) / static_cast<float>(dim) + eps);
  if constexpr (kVec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* y4 = reinterpret_cast<float4*>(yr);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = x4[i];
      const float4 g = w4[i];
      y4[i] = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                          float eps, cudaStream_t stream) {
  if (rows < 0 || dim < 0 || rows > INT_MAX) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (dim == 0) return cudaErrorInvalidValue;
  // 16-byte loads when every row starts aligned; cudaMalloc'd buffers are.
  const bool vec4 = dim % 4 == 0 && Aligned16(x) && Aligned16(w) && Aligned16(y);
  const int64_t work = vec4 ? dim / 4 : dim;
  const int64_t rounded = (work + kWarpSize - 1) / kWarpSize * kWarpSize;
  const int threads = static_cast<int>(rounded < kMaxThreads ? rounded : kMaxThreads);
  const dim3 grid(static_cast<unsigned>(rows));
  if (vec4) {
    DUET_LAUNCH(RmsNormKernel<true>, grid, threads, 0, stream)(x, w, y, dim, eps);
  } else {
    DUET_LAUNCH(RmsNormKernel<false>, grid, threads, 0, stream)(x, w, y, dim, eps);
  }
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

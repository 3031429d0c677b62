#include "kernels/cuda/rope.cuh"

#include <climits>

namespace duet::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxGridY = 65535;

// blockIdx.x is the token; threadIdx.y picks one of the block's heads and
// threadIdx.x strides over the head_dim / 2 rotation pairs. An odd head_dim
// leaves the last element alone, as the reference does.
__global__ void RopeKernel(float* x, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int64_t num_heads,
                           int64_t head_dim) {
  const int64_t token = blockIdx.x;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (head >= num_heads) return;
  const int64_t half = head_dim / 2;
  const float pos = static_cast<float>(positions[token]);
  float* v = x + (token * num_heads + head) * head_dim;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    // The angle rounded to float32, as the reference (and Hugging Face)
    // compute it: near 1e5 rad a float32 ulp is 8e-3, so a product kept any
    // wider would rotate by a visibly different angle.
    const float angle = __fmul_rn(pos, inv_freq[i]);
    float s, c;
    // Full-range sincosf, not __sincosf: angles reach 1e5 radians.
    sincosf(angle, &s, &c);
    const float x1 = v[i];
    const float x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

cudaError_t LaunchRope(float* x, const int32_t* positions, const float* inv_freq,
                       int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                       cudaStream_t stream) {
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0 || num_tokens > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  const int64_t half = head_dim / 2;
  if (num_tokens == 0 || num_heads == 0 || half == 0) return cudaSuccess;
  const int64_t rounded = (half + kWarpSize - 1) / kWarpSize * kWarpSize;
  const int threads_x = static_cast<int>(rounded < kThreadsPerBlock ? rounded : kThreadsPerBlock);
  // Small heads share a block so that blocks stay large enough to fill an SM.
  int64_t heads_per_block = kThreadsPerBlock / threads_x;
  if (heads_per_block > num_heads) heads_per_block = num_heads;
  const int64_t head_blocks = (num_heads + heads_per_block - 1) / heads_per_block;
  if (head_blocks > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(head_blocks));
  const dim3 block(threads_x, static_cast<unsigned>(heads_per_block));
  DUET_LAUNCH(RopeKernel, grid, block, 0, stream)(x, positions, inv_freq, num_heads, head_dim);
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

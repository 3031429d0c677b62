// Rotary position embedding on the GPU: the CUDA launcher behind
// kernels::cuda::Rope.
//
//   std::vector<float> inv_freq = RopeInvFreq(config);  // copied to d_inv_freq
//   cudaError_t err = LaunchRope(d_q, d_pos, d_inv_freq, tokens, heads, 128, stream);
//
// Matches kernels::ref::Rope: x is num_tokens x num_heads x head_dim, rotated
// in place with Hugging Face's rotate-half pairing (i, i + head_dim / 2) by the
// float32 angle float(positions[t]) * inv_freq[i]. All pointers are device
// memory; inv_freq holds head_dim / 2 entries computed on the host by
// kernels::RopeInvFreq, so Llama-3 scaling needs nothing here. Free of abseil
// because nvcc compiles it as C++17; callers use cuda_ops.h.
#ifndef DUET_KERNELS_CUDA_ROPE_CUH_
#define DUET_KERNELS_CUDA_ROPE_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// Enqueues the op on `stream` and returns the launch error; it does not wait.
// Negative sizes, or more tokens than a grid holds, give cudaErrorInvalidValue;
// an empty tensor enqueues nothing.
cudaError_t LaunchRope(float* x, const int32_t* positions, const float* inv_freq,
                       int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                       cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_ROPE_CUH_

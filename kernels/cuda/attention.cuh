// Paged attention on the GPU: the CUDA launcher behind the CUDA backend's
// PagedAttention, for a batch that mixes prefill chunks and decode tokens.
//
//   cudaError_t err = LaunchPagedAttention(args, stream);
//
// Matches kernels::ref::PagedAttention (kernels/attention.h's meaning):
// each sequence's query rows attend causally, within `window` positions
// where it is set, to the keys and values its block table holds in the pool;
// scores are scaled, capped by softcap * tanh(s / softcap) where softcap is
// set, and softmaxed. One warp takes one query row of one head: 32 keys at a
// time, a key per lane (its dot over the head), an online softmax over the
// chunks, and the weighted values summed by each lane for its share of the
// head's dimensions (head_dim <= kMaxHeadDim). Not yet the tiled prefill
// kernel or the context-split decode one a GPU wants (a long prefill chunk's
// rows are dealt out to warps, each reading its keys itself). Every pointer is device
// memory, `seqs` included (an array of DeviceSeq, the layout of
// kernels::AttentionSeq). F32 arithmetic; nothing waits. Free of abseil and
// of C++20 because nvcc compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_ATTENTION_CUH_
#define DUET_KERNELS_CUDA_ATTENTION_CUH_

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/kv_pool.cuh"

#include <cstdint>

namespace duet::kernels::cuda {

inline constexpr int64_t kMaxHeadDim = 256;

// kernels::AttentionSeq's layout (cuda_backend.cc checks that they agree).
struct DeviceSeq {
  int64_t first_row;
  int64_t num_tokens;
  int64_t start_pos;
  const int32_t* block_table;
};

struct AttentionParams {
  const float* q = nullptr;  // [rows][num_q_heads][head_dim]
  float* out = nullptr;      // [rows][num_q_heads][head_dim]
  const void* kv = nullptr;
  KvPoolShape pool;
  int64_t layer = 0;
  int64_t num_q_heads = 0;
  int64_t kv_head_begin = 0;
  int64_t kv_heads = 0;  // the KV heads q's heads group onto (>= 1)
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;
  const DeviceSeq* seqs = nullptr;
  int64_t num_seqs = 0;
};

// cudaErrorInvalidValue for a head_dim of 0 or above kMaxHeadDim, query
// heads that are not a multiple of kv_heads, or negative sizes; no sequences
// enqueue nothing.
cudaError_t LaunchPagedAttention(const AttentionParams& p, cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_ATTENTION_CUH_

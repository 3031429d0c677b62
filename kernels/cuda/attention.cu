#include "kernels/cuda/attention.cuh"

#include <climits>

#include "kernels/cuda/device.cuh"

namespace duet::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;  // query rows a block works on at once
// Blocks per (head, sequence): a long prefill chunk's rows are dealt out
// over kSplit x kWarps warps; a decode row leaves all but one idle.
constexpr int kSplit = 4;
constexpr int kPerLane = static_cast<int>(kMaxHeadDim / kWarpSize);  // dimensions a lane sums

// blockIdx.x: query head; blockIdx.y: sequence; blockIdx.z and the warp:
// which of the sequence's rows (row i for i % (kSplit * kWarps) = z * kWarps + warp).
// A chunk's 32 scores and then their weights pass through shared memory
// (two warp barriers a chunk) rather than through shuffle reductions: each
// lane folds the 32 values itself, the same sums in the same order on every
// lane.
template <typename T>
__global__ void PagedAttentionKernel(AttentionParams p) {
  DUET_SHARED(float, scores, kWarps * kWarpSize);
  DUET_SHARED(float, probs, kWarps * kWarpSize);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t h = blockIdx.x;
  const DeviceSeq seq = p.seqs[blockIdx.y];
  const KvPoolShape& s = p.pool;
  const int64_t hd = s.head_dim;
  const int64_t kvh = p.kv_head_begin + h / (p.num_q_heads / p.kv_heads);
  const T* pool = static_cast<const T*>(p.kv);
  const int64_t step = static_cast<int64_t>(kSplit) * kWarps;
  // Every lane of a warp takes the same rows, so the warp's collectives see
  // all 32 lanes; the loop bound is the same for the whole warp.
  for (int64_t i = static_cast<int64_t>(blockIdx.z) * kWarps + warp; i < seq.num_tokens; i += step) {
    const int64_t row = seq.first_row + i, pos = seq.start_pos + i;
    const int64_t lo = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const float* q = p.q + (row * p.num_q_heads + h) * hd;
    float acc[kPerLane];
    for (int d = 0; d < kPerLane; ++d) acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = lo; j0 <= pos; j0 += kWarpSize) {
      // This lane's key: its scaled (and capped) score.
      const int64_t j = j0 + lane;
      float score = -INFINITY;
      if (j <= pos) {
        const T* k = pool + s.Offset(seq.block_table[j / s.block_size], p.layer, kvh, j % s.block_size);
        float dot = 0.0f;
        for (int64_t e = 0; e < hd; ++e) dot += q[e] * Widen<T>(k[e]);
        score = dot * p.scale;
        if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
      }
      // The online softmax: the chunk's maximum, the old sums rescaled.
      const int64_t keys = pos - j0 + 1 < kWarpSize ? pos - j0 + 1 : kWarpSize;
      scores[warp * kWarpSize + lane] = score;
      __syncwarp();
      float m_new = m;
      for (int64_t t = 0; t < keys; ++t) m_new = fmaxf(m_new, scores[warp * kWarpSize + t]);
      const float rescale = expf(m - m_new);  // 0 on the first chunk (m = -inf)
      probs[warp * kWarpSize + lane] = j <= pos ? expf(score - m_new) : 0.0f;
      m = m_new;
      for (int d = 0; d < kPerLane; ++d) acc[d] *= rescale;
      __syncwarp();
      float sum = 0.0f;
      for (int64_t t = 0; t < keys; ++t) {
        const float w = probs[warp * kWarpSize + t];
        sum += w;
        const int64_t jt = j0 + t;
        const T* v = pool + s.Offset(seq.block_table[jt / s.block_size], p.layer, kvh, jt % s.block_size) +
                     s.kv_stride;
        for (int d = 0; d < kPerLane; ++d) {
          const int64_t e = lane + static_cast<int64_t>(d) * kWarpSize;
          if (e < hd) acc[d] += w * Widen<T>(v[e]);
        }
      }
      l = l * rescale + sum;
    }
    float* o = p.out + (row * p.num_q_heads + h) * hd;
    for (int d = 0; d < kPerLane; ++d) {
      const int64_t e = lane + static_cast<int64_t>(d) * kWarpSize;
      if (e < hd) o[e] = acc[d] / l;
    }
  }
}

template <typename T>
void Launch(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_seqs), kSplit);
  DUET_LAUNCH(PagedAttentionKernel<T>, grid, kWarps * kWarpSize, 0, stream)(p);
}

}  // namespace

cudaError_t LaunchPagedAttention(const AttentionParams& p, cudaStream_t stream) {
  const KvPoolShape& s = p.pool;
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim || s.block_size <= 0 || p.kv_heads <= 0 || p.num_q_heads < 0 ||
      p.num_q_heads % p.kv_heads != 0 || p.num_seqs < 0 || p.window < 0 || p.num_q_heads > INT_MAX ||
      p.num_seqs > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.num_seqs == 0 || p.num_q_heads == 0) return cudaSuccess;
  switch (s.element) {
    case KvPoolShape::kF32:
      Launch<float>(p, stream);
      break;
    case KvPoolShape::kBF16:
      Launch<__nv_bfloat16>(p, stream);
      break;
    case KvPoolShape::kF16:
      Launch<__half>(p, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

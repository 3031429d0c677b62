// Scalar reference implementations of every kernel op, on host memory.
//
//   kernels::ref::RmsNorm(x, w, y, rows, dim, eps);
//
// These are the ground truth that the fast CPU paths (AVX2/FMA, threaded) and
// the CUDA backend are compared against. Plain loops, no threads, no
// intrinsics: easy to read and to trust. All tensors are row-major float32.
#ifndef DUET_KERNELS_CPU_REFERENCE_H_
#define DUET_KERNELS_CPU_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dtype.h"
#include "kernels/moe.h"
#include "kernels/rope.h"

namespace duet::kernels::ref {

// c[m, n] = sum_k a[m, k] * w[n, k] (+ c[m, n] if accumulate): the shape of a
// linear layer whose weight is stored [out_features, in_features].
void Gemm(const float* a, const float* w, float* c, int64_t m, int64_t n, int64_t k,
          bool accumulate);

// The same over a weight matrix in any dtype: Gemm on Dequantize(w).
void Gemm(const float* a, const WeightMatrix& w, float* c, int64_t m, bool accumulate);

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w. x and y may alias.
void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);

// Rotates x[t, h, :] (num_tokens x num_heads x head_dim) in place by the angle
// positions[t] * inv_freq[i], Hugging Face's rotate-half pairing (i, i + d/2).
// inv_freq has head_dim / 2 entries (see RopeInvFreq).
void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
          int64_t num_heads, int64_t head_dim);

// out[t, i] = silu(gu[t, i]) * gu[t, inter + i]: gate and up side by side.
void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter);

// out[t, i] = gelu_tanh(gu[t, i]) * gu[t, inter + i] (GELU's tanh approximation).
void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter);

// x[i] *= s.
void Scale(float* x, float s, int64_t n);

// Paged attention as kernels/attention.h defines it, in double precision.
void PagedAttention(const PagedAttentionArgs& args);

// The new K and V of a batch into the pool, as kernels/attention.h defines it.
void KvStore(const KvStoreArgs& args);

// y[i] += x[i].
void Add(const float* x, float* y, int64_t n);

// out[i, :] = x[rows[i], :].
void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out);

// dst[r * dst_stride + c] = src[r * src_stride + c].
void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols);

// The mixture-of-experts MLP as kernels/moe.h defines it (RouteRow's
// choices), each expert's MLP by the Gemm and SiluMul above, the weighted
// sum in double; needs no scratch.
void Moe(const MoeArgs& args);

}  // namespace duet::kernels::ref

#endif  // DUET_KERNELS_CPU_REFERENCE_H_

// The GEMM seam on the SIMT runtime: the product computed on the host in
// the call's dtypes with an F32 accumulator, as a stream's work. Like
// cuBLAS, which picks its kernel (split-K among them) by the call's shape,
// it sums k in slices whose number depends on m: four below 4 rows, two
// below 16, one from 16, each slice in order and the slices' sums in order.
// A row's bits therefore depend on its batch here as on a GPU, which is
// what the backend's deterministic mode (gemm_fixed.cuh) removes and the op
// harness shows.
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace duet::kernels::cuda {
namespace {

float Load(const void* base, GemmType t, int64_t i) {
  switch (t) {
    case GemmType::kF32: return static_cast<const float*>(base)[i];
    case GemmType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case GemmType::kF16: return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

void Store(void* base, GemmType t, int64_t i, float v) {
  switch (t) {
    case GemmType::kF32: static_cast<float*>(base)[i] = v; return;
    case GemmType::kBF16: static_cast<uint16_t*>(base)[i] = FloatToBf16(v); return;
    case GemmType::kF16: static_cast<uint16_t*>(base)[i] = FloatToHalf(v); return;
  }
}

}  // namespace

cudaError_t Gemm(const GemmArgs& args, cudaStream_t stream) {
  GemmArgs g = args;
  if (cudaError_t e = CheckGemm(g); e != cudaSuccess) return e;
  if (g.m == 0 || g.n == 0) return cudaSuccess;
  return simt::EnqueueWork("cuBLAS GemmEx (emulated)", stream, [g] {
    const int64_t slices = g.m < 4 ? 4 : g.m < 16 ? 2 : 1;
    const int64_t slice = (g.k + slices - 1) / slices;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (int64_t p0 = 0; p0 < g.k; p0 += slice) {
          float part = 0.0f;
          for (int64_t p = p0; p < g.k && p < p0 + slice; ++p) {
            part += Load(g.a, g.a_type, i * g.lda + p) * Load(g.b, g.b_type, j * g.ldb + p);
          }
          acc += part;
        }
        const int64_t at = i * g.ldc + j;
        const float prior = g.beta == 0.0f ? 0.0f : Load(g.c, g.c_type, at);  // beta 0 never reads C, as cuBLAS
        Store(g.c, g.c_type, at, g.alpha * acc + g.beta * prior);
      }
    }
  });
}

}  // namespace duet::kernels::cuda

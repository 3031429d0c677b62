#include "kernels/cuda/gemm.h"

namespace duet::kernels::cuda {

cudaError_t CheckGemm(GemmArgs& g) {
  if (g.lda == 0) g.lda = g.k;
  if (g.ldb == 0) g.ldb = g.k;
  if (g.ldc == 0) g.ldc = g.n;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.lda < g.k || g.ldb < g.k || g.ldc < g.n) return cudaErrorInvalidValue;
  if (g.a_type != g.b_type) return cudaErrorInvalidValue;
  if ((g.m > 0 && g.n > 0) && (g.c == nullptr || (g.k > 0 && (g.a == nullptr || g.b == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace duet::kernels::cuda

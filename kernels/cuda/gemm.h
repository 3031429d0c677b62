// The GEMM seam: every cuBLAS/cuBLASLt call of the CUDA backend goes
// through this one function, which has two implementations: cuBLAS's
// cublasGemmEx on a GPU (gemm_cublas.cc, --config=cuda) and the SIMT
// runtime's emulation (gemm_simt.cc), which computes with the same input and
// output dtypes and F32 accumulation, so CI checks the calls' shapes,
// strides and dtypes without a GPU.
//
//   GemmArgs g{.m = tokens, .n = out, .k = in, .a = x, .b = w, .c = y};   // y = x w^T
//   cudaError_t e = Gemm(g, stream);
//
// Row-major, as the engine's linear layers: C[m][n] = alpha * A[m][k] *
// B[n][k]^T + beta * C, leading dimensions in elements. All pointers are
// device memory; the call is enqueued on `stream` and returns.
#ifndef DUET_KERNELS_CUDA_GEMM_H_
#define DUET_KERNELS_CUDA_GEMM_H_

#include <cstdint>

#include "kernels/cuda/cuda_compat.h"

namespace duet::kernels::cuda {

enum class GemmType { kF32, kBF16, kF16 };

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  GemmType a_type = GemmType::kF32;
  int64_t lda = 0;  // 0: k
  const void* b = nullptr;
  GemmType b_type = GemmType::kF32;
  int64_t ldb = 0;  // 0: k
  void* c = nullptr;
  GemmType c_type = GemmType::kF32;
  int64_t ldc = 0;  // 0: n
  float alpha = 1.0f, beta = 0.0f;
};

// cudaErrorInvalidValue for a shape or stride the call cannot take (negative
// sizes, a leading dimension below its row, A and B of different dtypes).
cudaError_t Gemm(const GemmArgs& args, cudaStream_t stream);

// What Gemm checks before either implementation runs: cudaSuccess or
// cudaErrorInvalidValue; `args` with its leading dimensions filled in.
cudaError_t CheckGemm(GemmArgs& args);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_GEMM_H_

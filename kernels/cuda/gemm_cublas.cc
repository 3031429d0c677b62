// The GEMM seam on a GPU: cublasGemmEx with F32 compute, one handle per
// host thread, row-major C = A B^T as cuBLAS's column-major C^T = B A^T.
#include <cublas_v2.h>

#include "kernels/cuda/gemm.h"

namespace duet::kernels::cuda {
namespace {

cudaDataType_t DataType(GemmType t) {
  switch (t) {
    case GemmType::kF32: return CUDA_R_32F;
    case GemmType::kBF16: return CUDA_R_16BF;
    case GemmType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

}  // namespace

cudaError_t Gemm(const GemmArgs& args, cudaStream_t stream) {
  GemmArgs g = args;
  if (cudaError_t e = CheckGemm(g); e != cudaSuccess) return e;
  if (g.m == 0 || g.n == 0) return cudaSuccess;
  thread_local cublasHandle_t handle = nullptr;
  if (handle == nullptr && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return cudaErrorInitializationError;
  if (cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorInvalidResourceHandle;
  const cublasStatus_t s =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
                   static_cast<int>(g.k), &g.alpha, g.b, DataType(g.b_type), static_cast<int>(g.ldb), g.a,
                   DataType(g.a_type), static_cast<int>(g.lda), &g.beta, g.c, DataType(g.c_type),
                   static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorLaunchFailure;
}

}  // namespace duet::kernels::cuda

// The mixture-of-experts op's own kernels on the GPU (kernels/moe.h): the
// routing of each row to its experts, and the gathering and weighted sum of
// the experts' outputs; the experts' MLPs are the backend's GEMMs.
//
//   LaunchMoeRoute(d_scores, rows, num_experts, top_k, renormalize, d_expert, d_weight, stream);
//   // per expert e: y_e = MLP_e(x) for every row, then
//   LaunchMoeGather(d_y_e, e, d_expert, rows, top_k, hidden, d_slots, stream);
//   LaunchMoeCombine(d_weight, d_slots, rows, top_k, hidden, d_out, stream);
//
// The routing is kernels::RouteRow's (the softmax in float, the top_k by
// score with ties to the lower index, renormalised where asked), one thread
// a row; the sum is the CPU backend's: out = 0, then out = weight_j * y_j +
// out for each choice j in RouteRow's order, one fused multiply-add each.
// All pointers are device memory; nothing waits. Free of abseil and of
// C++20 because nvcc compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_MOE_CUH_
#define DUET_KERNELS_CUDA_MOE_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// expert[r * top_k + j], weight[r * top_k + j]: row r's j-th choice.
cudaError_t LaunchMoeRoute(const float* scores, int64_t rows, int64_t num_experts, int64_t top_k, bool renormalize,
                           int32_t* expert, float* weight, cudaStream_t stream);
// slots[(r * top_k + j) * hidden + i] = y[r * hidden + i] wherever row r's
// j-th choice is expert `e`.
cudaError_t LaunchMoeGather(const float* y, int32_t e, const int32_t* expert, int64_t rows, int64_t top_k,
                            int64_t hidden, float* slots, cudaStream_t stream);
// out[r * hidden + i] = the weighted sum of row r's slots, in choice order.
cudaError_t LaunchMoeCombine(const float* weight, const float* slots, int64_t rows, int64_t top_k, int64_t hidden,
                             float* out, cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_MOE_CUH_

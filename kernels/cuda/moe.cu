#include "kernels/cuda/moe.cuh"

#include "kernels/cuda/device.cuh"

namespace duet::kernels::cuda {
namespace {

// Elements per thread (a grid-stride loop's turns): a block's threads
// read consecutive elements each turn.
constexpr int64_t kPerThread = 4;

__global__ void RouteKernel(const float* __restrict__ scores, int64_t rows, int64_t num_experts, int64_t top_k,
                            bool renormalize, int32_t* __restrict__ expert, float* __restrict__ weight) {
  for (int64_t r = GridFirst(); r < rows; r += GridStride()) {
    const float* s = scores + r * num_experts;
    int32_t* ex = expert + r * top_k;
    float* w = weight + r * top_k;
    float mx = s[0];
    for (int64_t e = 1; e < num_experts; ++e) mx = fmaxf(mx, s[e]);
    float z = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) z += expf(s[e] - mx);
    float chosen = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        bool taken = false;
        for (int64_t t = 0; t < j; ++t) taken = taken || ex[t] == e;
        if (taken) continue;
        if (best < 0 || s[e] > s[best]) best = static_cast<int32_t>(e);
      }
      ex[j] = best;
      w[j] = expf(s[best] - mx) / z;
      chosen += w[j];
    }
    if (renormalize) {
      for (int64_t j = 0; j < top_k; ++j) w[j] /= chosen;
    }
  }
}

__global__ void GatherKernel(const float* __restrict__ y, int32_t e, const int32_t* __restrict__ expert,
                             int64_t top_k, int64_t hidden, float* __restrict__ slots, int64_t n) {
  for (int64_t t = GridFirst(); t < n; t += GridStride()) {
    const int64_t r = t / hidden, i = t % hidden;
    for (int64_t j = 0; j < top_k; ++j) {
      if (expert[r * top_k + j] == e) slots[(r * top_k + j) * hidden + i] = y[t];
    }
  }
}

__global__ void CombineKernel(const float* __restrict__ weight, const float* __restrict__ slots, int64_t top_k,
                              int64_t hidden, float* __restrict__ out, int64_t n) {
  for (int64_t t = GridFirst(); t < n; t += GridStride()) {
    const int64_t r = t / hidden, i = t % hidden;
    float o = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) o = fmaf(weight[r * top_k + j], slots[(r * top_k + j) * hidden + i], o);
    out[t] = o;
  }
}

}  // namespace

cudaError_t LaunchMoeRoute(const float* scores, int64_t rows, int64_t num_experts, int64_t top_k, bool renormalize,
                           int32_t* expert, float* weight, cudaStream_t stream) {
  if (rows < 0 || num_experts <= 0 || top_k <= 0 || top_k > num_experts) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  DUET_LAUNCH(RouteKernel, BlocksFor(rows), kThreads, 0, stream)(scores, rows, num_experts, top_k, renormalize,
                                                                 expert, weight);
  return cudaGetLastError();
}

cudaError_t LaunchMoeGather(const float* y, int32_t e, const int32_t* expert, int64_t rows, int64_t top_k,
                            int64_t hidden, float* slots, cudaStream_t stream) {
  if (rows < 0 || top_k <= 0 || hidden < 0) return cudaErrorInvalidValue;
  const int64_t n = rows * hidden;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(GatherKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(y, e, expert, top_k, hidden, slots, n);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* weight, const float* slots, int64_t rows, int64_t top_k, int64_t hidden,
                             float* out, cudaStream_t stream) {
  if (rows < 0 || top_k <= 0 || hidden < 0) return cudaErrorInvalidValue;
  const int64_t n = rows * hidden;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(CombineKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(weight, slots, top_k, hidden, out, n);
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

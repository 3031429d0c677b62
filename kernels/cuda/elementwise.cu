#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/device.cuh"

namespace duet::kernels::cuda {
namespace {

// Elements per thread (a grid-stride loop's turns): a block's threads
// read consecutive elements each turn.
constexpr int64_t kPerThread = 4;

// expf, not __expf: the reference is exact, and the fast one is off by
// several ulps over the range gates take.
struct Silu {
  __device__ static float Apply(float g) { return g / (1.0f + expf(-g)); }
};
// 0.5 x (1 + tanh(z)) = x / (1 + e^(-2z)), z = sqrt(2 / pi) (x + 0.044715 x^3).
struct GeluTanh {
  __device__ static float Apply(float x) {
    return x / (1.0f + expf(-2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
};

template <class Act>
__global__ void GatedKernel(const float* __restrict__ gu, float* __restrict__ out, int64_t inter, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) {
    const int64_t r = e / inter, i = e - r * inter;
    const float* g = gu + r * 2 * inter;
    out[e] = Act::Apply(g[i]) * g[inter + i];
  }
}

__global__ void ScaleKernel(float* x, float s, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) x[e] *= s;
}

__global__ void ToBf16Kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) out[e] = RoundTo<__nv_bfloat16>(x[e]);
}

__global__ void RoundThroughBf16Kernel(const float* x, float* out, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) out[e] = Widen(RoundTo<__nv_bfloat16>(x[e]));
}

__global__ void AddKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) y[e] += x[e];
}

__global__ void AddBiasKernel(const float* __restrict__ bias, float* __restrict__ c, int64_t cols, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) c[e] += bias[e % cols];
}

__global__ void GatherRowsKernel(const float* __restrict__ x, const int32_t* __restrict__ rows, int64_t dim,
                                 int64_t n, float* __restrict__ out) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) {
    const int64_t i = e / dim, d = e - i * dim;
    out[e] = x[static_cast<int64_t>(rows[i]) * dim + d];
  }
}

__global__ void Copy2DKernel(const float* __restrict__ src, int64_t src_stride, float* __restrict__ dst,
                             int64_t dst_stride, int64_t cols, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) {
    const int64_t r = e / cols, c = e - r * cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

template <class Act>
cudaError_t LaunchGated(const float* gu, float* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows < 0 || inter < 0) return cudaErrorInvalidValue;
  const int64_t n = rows * inter;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(GatedKernel<Act>, BlocksFor(n, kPerThread), kThreads, 0, stream)(gu, out, inter, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSiluMul(const float* gu, float* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  return LaunchGated<Silu>(gu, out, rows, inter, stream);
}

cudaError_t LaunchGeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  return LaunchGated<GeluTanh>(gu, out, rows, inter, stream);
}

cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(ScaleKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(x, s, n);
  return cudaGetLastError();
}

cudaError_t LaunchToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(ToBf16Kernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(
      x, reinterpret_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

cudaError_t LaunchRoundThroughBf16(const float* x, float* out, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(RoundThroughBf16Kernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(x, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(AddKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(const float* bias, float* c, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(AddBiasKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(bias, c, cols, n);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out,
                             cudaStream_t stream) {
  if (num_rows < 0 || dim < 0) return cudaErrorInvalidValue;
  const int64_t n = num_rows * dim;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(GatherRowsKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(x, rows, dim, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchCopy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  DUET_LAUNCH(Copy2DKernel, BlocksFor(n, kPerThread), kThreads, 0, stream)(src, src_stride, dst, dst_stride, cols, n);
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

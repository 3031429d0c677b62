#include "kernels/cuda/gemm_fixed.cuh"

#include <climits>

namespace duet::kernels::cuda {
namespace {

// Both kernels give every output the same arithmetic: acc = 0, then
// acc = fma(a[row][p], b[col][p], acc) for p = 0 .. k-1, then C = acc (or
// C + acc). So which of them runs, and which tile an output falls in,
// changes no bit: the launcher picks by shape freely.

constexpr int kThreadsPerBlock = 256;

// Few rows (decode): a thread per output, a block per row and 256 columns,
// no shared memory and no barrier; a thread walks its weight row in order.
__global__ void FixedOrderGemvKernel(const float* a, const float* b, float* c, int64_t n, int64_t k,
                                     bool accumulate) {
  const int64_t row = blockIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreadsPerBlock + threadIdx.x;
  if (col >= n) return;
  const float* ar = a + row * k;
  const float* br = b + col * k;
  float acc = 0.0f;
  for (int64_t p = 0; p < k; ++p) acc = __fmaf_rn(ar[p], br[p], acc);
  float* out = c + row * n + col;
  *out = accumulate ? *out + acc : acc;
}

// More rows: 64 x 64 output tiles, a thread per 4 x 4 outputs (rows ty +
// 16 i, columns tx + 16 j), k in steps of 16 through shared memory (B's
// tile transposed and padded, so the stores and the reads fall in distinct
// banks).
constexpr int kTile = 64, kStep = 16, kSub = 4;

__global__ void FixedOrderGemmKernel(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                                     bool accumulate) {
  DUET_SHARED(float, as, kTile * kStep);
  DUET_SHARED(float, bs, kStep * (kTile + 1));
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kSub][kSub];
  for (int i = 0; i < kSub; ++i)
    for (int j = 0; j < kSub; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kStep) {
    // 64 rows x 16 k of each operand: four elements a thread, k fastest.
    for (int e = static_cast<int>(threadIdx.x); e < kTile * kStep; e += kThreadsPerBlock) {
      const int r = e / kStep, p = e % kStep;
      const int64_t kk = k0 + p;
      as[r * kStep + p] = row0 + r < m && kk < k ? a[(row0 + r) * k + kk] : 0.0f;
      bs[p * (kTile + 1) + r] = col0 + r < n && kk < k ? b[(col0 + r) * k + kk] : 0.0f;
    }
    __syncthreads();
    const int64_t steps = k - k0 < kStep ? k - k0 : kStep;
    for (int64_t p = 0; p < steps; ++p) {
      float av[kSub], bv[kSub];
      for (int i = 0; i < kSub; ++i) av[i] = as[(ty + 16 * i) * kStep + p];
      for (int j = 0; j < kSub; ++j) bv[j] = bs[p * (kTile + 1) + tx + 16 * j];
      for (int i = 0; i < kSub; ++i)
        for (int j = 0; j < kSub; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < kSub; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= m) continue;
    for (int j = 0; j < kSub; ++j) {
      const int64_t col = col0 + tx + 16 * j;
      if (col >= n) continue;
      float* out = c + row * n + col;
      *out = accumulate ? *out + acc[i][j] : acc[i][j];
    }
  }
}

// Rows below this take the GEMV kernel.
constexpr int64_t kTiledFromRows = 16;

}  // namespace

cudaError_t LaunchFixedOrderGemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                                 bool accumulate, cudaStream_t stream) {
  if (m < 0 || n < 0 || k < 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  if (m < kTiledFromRows) {
    const int64_t gx = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (gx > INT_MAX) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(m));
    DUET_LAUNCH(FixedOrderGemvKernel, grid, kThreadsPerBlock, 0, stream)(a, b, c, n, k, accumulate);
    return cudaGetLastError();
  }
  const int64_t gx = (n + kTile - 1) / kTile, gy = (m + kTile - 1) / kTile;
  if (gx > INT_MAX || gy > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  DUET_LAUNCH(FixedOrderGemmKernel, grid, kThreadsPerBlock, 0, stream)(a, b, c, m, n, k, accumulate);
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

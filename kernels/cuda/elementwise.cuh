// The element-wise and row-moving ops on the GPU: the CUDA launchers behind
// the CUDA backend's SiluMul, GeluTanhMul, Scale, Add, GatherRows and Copy2D,
// and the GEMM's bias
// (one kernel per op; they share this pair because each is a few lines).
//
//   cudaError_t err = LaunchSiluMul(d_gate_up, d_out, rows, inter, stream);
//
// Each matches its kernels::ref loop (kernels/cpu/reference.h) on float32
// row-major arrays in device memory: SiluMul and GeluTanhMul read a row's
// gate then its up half ([rows][2 * inter]); GatherRows' indices are device
// memory too. Negative sizes give cudaErrorInvalidValue, empty ones enqueue
// nothing; the launch is on `stream` and nothing waits. Free of abseil
// because nvcc compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_ELEMENTWISE_CUH_
#define DUET_KERNELS_CUDA_ELEMENTWISE_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// out[r, i] = silu(gate[r, i]) * up[r, i], silu(g) = g / (1 + e^-g).
cudaError_t LaunchSiluMul(const float* gu, float* out, int64_t rows, int64_t inter, cudaStream_t stream);
// out[r, i] = gelu_tanh(gate[r, i]) * up[r, i] (GELU's tanh approximation).
cudaError_t LaunchGeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter, cudaStream_t stream);
// x[i] *= s.
cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream);
// y[i] += x[i].
cudaError_t LaunchAdd(const float* x, float* y, int64_t n, cudaStream_t stream);
// c[i, j] += bias[j] for i < rows, j < cols (a linear layer's bias).
cudaError_t LaunchAddBias(const float* bias, float* c, int64_t rows, int64_t cols, cudaStream_t stream);
// out[i, :] = x[rows[i], :], rows of `dim` floats.
cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out,
                             cudaStream_t stream);
// out[i] = x[i] rounded to BF16 (to nearest even), as raw bits: the BF16
// mode's GEMM inputs.
cudaError_t LaunchToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
// out[i] = x[i] rounded to BF16 and widened back (x and out may alias): the
// BF16 mode's GEMM inputs for the deterministic mode's F32 GEMM, whose
// products of such values are exact, as a BF16 GEMM's are.
cudaError_t LaunchRoundThroughBf16(const float* x, float* out, int64_t n, cudaStream_t stream);
// dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols.
cudaError_t LaunchCopy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                         int64_t cols, cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_ELEMENTWISE_CUH_

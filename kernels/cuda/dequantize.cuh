// Weight rows of any dtype (kernels/dtype.h) as floats on the GPU: the CUDA
// launchers behind the CUDA backend's GEMM (a weight matrix widened into F32
// scratch for the F32 GEMM) and its embedding lookup (the rows a batch's
// token ids name).
//
//   DeviceWeights w{.dtype = DeviceWeights::kQ4, .values = d_q, .scales = d_s, .n = n, .k = k,
//                   .row_bytes = row_bytes};
//   cudaError_t err = LaunchDequantize(w, d_out, stream);
//
// Each value is the one kernels::DequantizeRow gives, bit for bit: f32 as
// is, bf16 and f16 widened exactly, q8 / q4 / q4z as float(q - zero) x scale
// with one rounding. All pointers are device memory; nothing waits. Free of
// abseil because nvcc compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_DEQUANTIZE_CUH_
#define DUET_KERNELS_CUDA_DEQUANTIZE_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

// A WeightMatrix whose arrays are in device memory (kernels/dtype.h's layout).
struct DeviceWeights {
  enum Type { kF32, kBF16, kF16, kQ8, kQ4, kQ4Z } dtype = kF32;
  const void* values = nullptr;
  const float* scales = nullptr;   // q8, q4, q4z: [n][blocks of 32]
  const uint8_t* zeros = nullptr;  // q4z: [n][blocks]
  int64_t n = 0;
  int64_t k = 0;
  int64_t row_bytes = 0;  // of values
};

// out[j][e] = row j's element e, for every row (out: n x k floats).
cudaError_t LaunchDequantize(const DeviceWeights& w, float* out, cudaStream_t stream);
// out[t][e] = row ids[t]'s element e, for t < num_tokens; ids outside [0,
// n) give zeros rather than a read outside the table (the caller checks
// ids against the vocabulary before they reach the device).
cudaError_t LaunchEmbedding(const DeviceWeights& w, const int32_t* ids, int64_t num_tokens, float* out,
                            cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_DEQUANTIZE_CUH_

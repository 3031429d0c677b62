#include "kernels/cuda/dequantize.cuh"

#include "kernels/cuda/device.cuh"

namespace duet::kernels::cuda {
namespace {

constexpr int64_t kBlock = 32;  // kernels::kQuantBlock

// Element e of row j, as kernels::DequantizeRow computes it.
__device__ float Element(const DeviceWeights& w, int64_t j, int64_t e) {
  switch (w.dtype) {
    case DeviceWeights::kF32:
      return static_cast<const float*>(w.values)[j * w.k + e];
    case DeviceWeights::kBF16:
      return Widen(static_cast<const __nv_bfloat16*>(w.values)[j * w.k + e]);
    case DeviceWeights::kF16:
      return Widen(static_cast<const __half*>(w.values)[j * w.k + e]);
    default:
      break;
  }
  const int64_t blocks = (w.k + kBlock - 1) / kBlock;
  const int64_t b = e / kBlock, i = e % kBlock;
  const uint8_t* row = static_cast<const uint8_t*>(w.values) + j * w.row_bytes;
  int q;
  if (w.dtype == DeviceWeights::kQ8) {
    q = static_cast<int8_t>(row[b * kBlock + i]);
  } else {
    // Byte i of a block holds element i in its low nibble, i + 16 in its high one.
    const uint8_t byte = row[b * kBlock / 2 + i % 16];
    const int nibble = i < 16 ? (byte & 0x0f) : (byte >> 4);
    q = nibble - (w.dtype == DeviceWeights::kQ4 ? 8 : static_cast<int>(w.zeros[j * blocks + b]));
  }
  return static_cast<float>(q) * w.scales[j * blocks + b];
}

// A thread a run of 32 elements of a row (a quantized block), which it
// widens in order: fewer threads than elements, and each block's scale read once.
__global__ void DequantizeKernel(DeviceWeights w, float* __restrict__ out, int64_t runs) {
  const int64_t per_row = (w.k + kBlock - 1) / kBlock;
  for (int64_t t = GridFirst(); t < runs; t += GridStride()) {
    const int64_t j = t / per_row, e0 = t % per_row * kBlock;
    const int64_t e1 = e0 + kBlock < w.k ? e0 + kBlock : w.k;
    for (int64_t e = e0; e < e1; ++e) out[j * w.k + e] = Element(w, j, e);
  }
}

__global__ void EmbeddingKernel(DeviceWeights w, const int32_t* __restrict__ ids, float* __restrict__ out,
                                int64_t total) {
  for (int64_t t = GridFirst(); t < total; t += GridStride()) {
    const int64_t id = ids[t / w.k];
    out[t] = id >= 0 && id < w.n ? Element(w, id, t % w.k) : 0.0f;
  }
}

bool Valid(const DeviceWeights& w) {
  if (w.n < 0 || w.k < 0 || w.row_bytes < 0) return false;
  if (w.n > 0 && w.k > 0 && w.values == nullptr) return false;
  const bool quantized =
      w.dtype == DeviceWeights::kQ8 || w.dtype == DeviceWeights::kQ4 || w.dtype == DeviceWeights::kQ4Z;
  if (quantized && w.n > 0 && w.k > 0 && w.scales == nullptr) return false;
  if (w.dtype == DeviceWeights::kQ4Z && w.n > 0 && w.k > 0 && w.zeros == nullptr) return false;
  return w.dtype >= DeviceWeights::kF32 && w.dtype <= DeviceWeights::kQ4Z;
}

}  // namespace

cudaError_t LaunchDequantize(const DeviceWeights& w, float* out, cudaStream_t stream) {
  if (!Valid(w)) return cudaErrorInvalidValue;
  if (w.n == 0 || w.k == 0) return cudaSuccess;
  const int64_t runs = w.n * ((w.k + kBlock - 1) / kBlock);
  DUET_LAUNCH(DequantizeKernel, BlocksFor(runs), kThreads, 0, stream)(w, out, runs);
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const DeviceWeights& w, const int32_t* ids, int64_t num_tokens, float* out,
                            cudaStream_t stream) {
  if (!Valid(w) || num_tokens < 0) return cudaErrorInvalidValue;
  const int64_t total = num_tokens * w.k;
  if (total == 0) return cudaSuccess;
  DUET_LAUNCH(EmbeddingKernel, BlocksFor(total), kThreads, 0, stream)(w, ids, out, total);
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

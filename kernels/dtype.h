// The number formats weights are stored in, and a linear layer's weight
// matrix in any of them.
//
//   HostWeights q = QuantizeWeights(w.data(), n, k, DType::kQ8);
//   be->Gemm(x, q.view(), nullptr, y, rows, /*accumulate=*/false);
//   std::vector<float> exact = Dequantize(q.view());   // what the kernels multiply by
//
// Formats (a matrix is [n][k], row-major: row j holds output j's weights):
//   kF32   float
//   kBF16  bfloat16 (the top half of a float)
//   kF16   IEEE half
//   kQ8    blocks of 32 int8 along k, one scale per block:
//          w = q * scale
//   kQ4    blocks of 32 4-bit values, one scale: w = (q - 8) * scale
//   kQ4Z   kQ4 with a zero point per block, as GPTQ stores (0..15 when
//          duet quantizes, up to 16 from GPTQ's stored-minus-one zeros):
//          w = (q - zero) * scale
// In the quantized formats a row's k is padded to whole blocks with zeros;
// values are int8 [n][blocks * 32] (kQ8) or bytes [n][blocks * 16] (kQ4,
// kQ4Z: byte i of a block holds element i in its low nibble and element
// i + 16 in its high one), scales [n][blocks], zeros [n][blocks]. A
// scale is an f16 value (as quantizing rounds it, and as GPTQ stores it)
// held as a float, so that the kernels broadcast it straight from memory.
// A weight's value is computed in float as written above (one rounding),
// which Dequantize and every kernel agree on, so a product differs from
// the F32 product over Dequantize's matrix only as summation order does.
#ifndef DUET_KERNELS_DTYPE_H_
#define DUET_KERNELS_DTYPE_H_

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace duet::kernels {

enum class DType : uint8_t { kF32, kBF16, kF16, kQ8, kQ4, kQ4Z };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                                       DType::kQ8,  DType::kQ4,   DType::kQ4Z};

// "f32", "bf16", "f16", "q8", "q4", "q4z".
const char* DTypeName(DType d);
std::optional<DType> ParseDType(std::string_view name);

bool IsQuantized(DType d);
// Bits a weight costs in memory, scales and zero points included.
double BitsPerWeight(DType d);

inline constexpr int64_t kQuantBlock = 32;
inline constexpr int64_t QuantBlocks(int64_t k) { return (k + kQuantBlock - 1) / kQuantBlock; }

// The 4-bit value of element e (< kQuantBlock) of a kQ4/kQ4Z block's 16
// bytes, and setting it (q < 16).
inline int Nibble(const uint8_t* block, int64_t e) { return e < 16 ? (block[e] & 0x0f) : (block[e - 16] >> 4); }
inline void SetNibble(uint8_t* block, int64_t e, int q) {
  if (e < 16) {
    block[e] = static_cast<uint8_t>((block[e] & 0xf0) | q);
  } else {
    block[e - 16] = static_cast<uint8_t>((block[e - 16] & 0x0f) | (q << 4));
  }
}

// Half-precision conversions. To float: exact (every F16 and BF16 value,
// subnormals, infinities and NaN payloads included, is a float). From
// float: round to nearest, ties to even; NaN stays NaN (quieted), overflow
// gives inf, tiny values become F16 subnormals or signed zero.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
uint16_t FloatToBf16(float f);

// A weight matrix [n][k] in backend memory, laid out as above.
struct WeightMatrix {
  DType dtype = DType::kF32;
  int64_t n = 0, k = 0;
  const void* values = nullptr;
  const float* scales = nullptr;     // kQ8, kQ4, kQ4Z
  const uint8_t* zeros = nullptr;    // kQ4Z

  // Bytes of one row's values.
  int64_t RowBytes() const;
  // Rows [first, first + count) as a matrix of their own.
  WeightMatrix Rows(int64_t first, int64_t count) const;
};

// An owning host copy of a weight matrix.
struct HostWeights {
  DType dtype = DType::kF32;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> values;
  std::vector<float> scales;
  std::vector<uint8_t> zeros;

  WeightMatrix view() const;
  int64_t bytes() const;
};

// The rows of `parts` (one dtype and k) one after another.
HostWeights StackRows(const std::vector<HostWeights>& parts);

// `w` ([n][k] floats) in `dtype`: halves rounded to nearest even; kQ8 and
// kQ4 symmetric per block (the largest magnitude maps to 127, or to -8 as
// llama.cpp's Q4_0 does), kQ4Z from each block's min and max.
HostWeights QuantizeWeights(const float* w, int64_t n, int64_t k, DType dtype);

// Row j's k weights, as the kernels compute with them.
void DequantizeRow(const WeightMatrix& w, int64_t j, float* out);
std::vector<float> Dequantize(const WeightMatrix& w);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_DTYPE_H_

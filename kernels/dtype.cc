#include "kernels/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace duet::kernels {
namespace {

// Row j of a quantized matrix: its values, scales and zeros.
struct QuantRow {
  const uint8_t* values;
  const float* scales;
  const uint8_t* zeros;
};

QuantRow RowOf(const WeightMatrix& w, int64_t j) {
  const int64_t blocks = QuantBlocks(w.k);
  return {static_cast<const uint8_t*>(w.values) + j * w.RowBytes(), w.scales + j * blocks,
          w.zeros != nullptr ? w.zeros + j * blocks : nullptr};
}

}  // namespace

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kQ8: return "q8";
    case DType::kQ4: return "q4";
    case DType::kQ4Z: return "q4z";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (std::string_view(DTypeName(d)) == name) return d;
  }
  return std::nullopt;
}

bool IsQuantized(DType d) { return d == DType::kQ8 || d == DType::kQ4 || d == DType::kQ4Z; }

double BitsPerWeight(DType d) {
  switch (d) {
    case DType::kF32: return 32;
    case DType::kBF16:
    case DType::kF16: return 16;
    case DType::kQ8: return 8 + 32.0 / kQuantBlock;
    case DType::kQ4: return 4 + 32.0 / kQuantBlock;
    case DType::kQ4Z: return 4 + 40.0 / kQuantBlock;
  }
  return 0;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);  // Inf, or NaN with its payload.
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal mant * 2^-24: normalize into an F32 normal.
      exp = 127 - 14;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToBf16(float value) {
  uint32_t b = std::bit_cast<uint32_t>(value);
  if ((b & 0x7FFFFFFF) > 0x7F800000) {
    // NaN: truncate, and set the quiet bit so a payload living only in the
    // low bits does not become inf.
    return static_cast<uint16_t>((b >> 16) | 0x0040);
  }
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is
  // the correct result, up to inf.
  b += 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

uint16_t FloatToHalf(float value) {
  const uint32_t b = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  const uint32_t a = b & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00 | ((a >> 13) & 0x3FF);  // Quiet NaN.
  // 65520 is halfway between 65504 (max F16, odd mantissa) and 65536: ties
  // to even go up, so it and everything above become inf.
  if (a >= 0x477FF000) return sign | 0x7C00;
  if (a >= 0x38800000) {  // >= 2^-14: F16 normal.
    const uint32_t r = a + 0xFFF + ((a >> 13) & 1);
    return sign | static_cast<uint16_t>((r >> 13) - (112 << 10));
  }
  if (a < 0x33000000) return sign;  // Below half the smallest subnormal 2^-24.
  // F16 subnormal: count in units of 2^-24 with round to nearest even. A
  // round up from the largest subnormal lands on 0x400, the smallest normal.
  const uint32_t exp = a >> 23;
  const uint32_t mant = (a & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

int64_t WeightMatrix::RowBytes() const {
  switch (dtype) {
    case DType::kF32: return k * 4;
    case DType::kBF16:
    case DType::kF16: return k * 2;
    case DType::kQ8: return QuantBlocks(k) * kQuantBlock;
    case DType::kQ4:
    case DType::kQ4Z: return QuantBlocks(k) * kQuantBlock / 2;
  }
  return 0;
}

WeightMatrix WeightMatrix::Rows(int64_t first, int64_t count) const {
  WeightMatrix w = *this;
  w.n = count;
  w.values = static_cast<const uint8_t*>(values) + first * RowBytes();
  const int64_t blocks = QuantBlocks(k);
  if (scales != nullptr) w.scales = scales + first * blocks;
  if (zeros != nullptr) w.zeros = zeros + first * blocks;
  return w;
}

WeightMatrix HostWeights::view() const {
  WeightMatrix w{.dtype = dtype, .n = n, .k = k, .values = values.data()};
  if (IsQuantized(dtype)) w.scales = scales.data();
  if (dtype == DType::kQ4Z) w.zeros = zeros.data();
  return w;
}

int64_t HostWeights::bytes() const {
  return static_cast<int64_t>(values.size() + sizeof(float) * scales.size() + zeros.size());
}

HostWeights QuantizeWeights(const float* w, int64_t n, int64_t k, DType dtype) {
  HostWeights h{.dtype = dtype, .n = n, .k = k};
  const int64_t row_bytes = WeightMatrix{.dtype = dtype, .n = n, .k = k}.RowBytes();
  h.values.assign(n * row_bytes, 0);
  if (dtype == DType::kF32) {
    std::memcpy(h.values.data(), w, n * k * sizeof(float));
    return h;
  }
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    auto* out = reinterpret_cast<uint16_t*>(h.values.data());
    for (int64_t i = 0; i < n * k; ++i) out[i] = dtype == DType::kBF16 ? FloatToBf16(w[i]) : FloatToHalf(w[i]);
    return h;
  }
  const int64_t blocks = QuantBlocks(k);
  h.scales.assign(n * blocks, 0);
  if (dtype == DType::kQ4Z) h.zeros.assign(n * blocks, 0);
  for (int64_t j = 0; j < n; ++j) {
    const float* row = w + j * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t e0 = b * kQuantBlock, e1 = std::min(k, e0 + kQuantBlock);
      float amax = 0, signed_max = 0, lo = 0, hi = 0;
      for (int64_t e = e0; e < e1; ++e) {
        if (std::fabs(row[e]) > amax) {
          amax = std::fabs(row[e]);
          signed_max = row[e];
        }
        lo = std::min(lo, row[e]);
        hi = std::max(hi, row[e]);
      }
      float scale = 0;
      int zero = 0;
      if (dtype == DType::kQ8) scale = amax / 127.0f;
      if (dtype == DType::kQ4) scale = signed_max / -8.0f;
      if (dtype == DType::kQ4Z) {
        scale = (hi - lo) / 15.0f;
        zero = scale == 0 ? 0 : std::clamp(static_cast<int>(std::nearbyint(-lo / scale)), 0, 15);
      }
      const float s = HalfToFloat(FloatToHalf(scale));  // An f16 value; quantized against as stored.
      h.scales[j * blocks + b] = s;
      if (dtype == DType::kQ4Z) h.zeros[j * blocks + b] = static_cast<uint8_t>(zero);
      const float inv = s == 0 ? 0 : 1.0f / s;
      uint8_t* block = h.values.data() + j * row_bytes + b * (dtype == DType::kQ8 ? kQuantBlock : kQuantBlock / 2);
      for (int64_t e = e0; e < e1; ++e) {
        const int q = static_cast<int>(std::nearbyint(row[e] * inv));
        if (dtype == DType::kQ8) {
          block[e - e0] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127, 127)));
        } else {
          SetNibble(block, e - e0, std::clamp(q + (dtype == DType::kQ4 ? 8 : zero), 0, 15));
        }
      }
      // Padding past k: zero weights.
      if (dtype != DType::kQ8) {
        for (int64_t e = e1 - e0; e < kQuantBlock; ++e) SetNibble(block, e, dtype == DType::kQ4 ? 8 : zero);
      }
    }
  }
  return h;
}

HostWeights StackRows(const std::vector<HostWeights>& parts) {
  HostWeights h{.dtype = parts.at(0).dtype, .n = 0, .k = parts[0].k};
  for (const HostWeights& p : parts) {
    h.n += p.n;
    h.values.insert(h.values.end(), p.values.begin(), p.values.end());
    h.scales.insert(h.scales.end(), p.scales.begin(), p.scales.end());
    h.zeros.insert(h.zeros.end(), p.zeros.begin(), p.zeros.end());
  }
  return h;
}

void DequantizeRow(const WeightMatrix& w, int64_t j, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.values) + j * w.k, w.k * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t* row = static_cast<const uint16_t*>(w.values) + j * w.k;
      for (int64_t e = 0; e < w.k; ++e) out[e] = w.dtype == DType::kBF16 ? Bf16ToFloat(row[e]) : HalfToFloat(row[e]);
      return;
    }
    case DType::kQ8:
    case DType::kQ4:
    case DType::kQ4Z: {
      const QuantRow r = RowOf(w, j);
      for (int64_t e = 0; e < w.k; ++e) {
        const int64_t b = e / kQuantBlock, i = e % kQuantBlock;
        const float s = r.scales[b];
        int q;
        if (w.dtype == DType::kQ8) {
          q = static_cast<int8_t>(r.values[b * kQuantBlock + i]);
        } else {
          q = Nibble(r.values + b * kQuantBlock / 2, i) - (w.dtype == DType::kQ4 ? 8 : r.zeros[b]);
        }
        out[e] = static_cast<float>(q) * s;
      }
      return;
    }
  }
}

std::vector<float> Dequantize(const WeightMatrix& w) {
  std::vector<float> out(w.n * w.k);
  for (int64_t j = 0; j < w.n; ++j) DequantizeRow(w, j, out.data() + j * w.k);
  return out;
}

}  // namespace duet::kernels

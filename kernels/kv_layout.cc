#include "kernels/kv_layout.h"

#include <cstring>

namespace duet::kernels {

bool IsKvDType(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

float KvLayout::Value(const void* pool, int64_t offset) const {
  const uint8_t* p = At(pool, offset);
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return dtype == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
}

void KvLayout::Store(void* pool, int64_t offset, const float* values, int64_t n) const {
  uint8_t* p = At(pool, offset);
  if (dtype == DType::kF32) {
    std::memcpy(p, values, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
    std::memcpy(p + i * 2, &h, sizeof h);
  }
}

}  // namespace duet::kernels

// The weight formats of kernels/dtype.h: half conversions (every value,
// every midpoint), hand-checked blocks (bit order, zero points), and what
// quantizing costs and keeps.
#include "kernels/dtype.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <vector>

namespace duet::kernels {
namespace {

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_CASE("F16 and BF16 decode special values exactly") {
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));  // Smallest subnormal.
  CHECK(HalfToFloat(0x03FF) == std::ldexp(1023.0f, -24));  // Largest subnormal.
  CHECK(HalfToFloat(0x0400) == std::ldexp(1.0f, -14));
  CHECK(HalfToFloat(0x3C00) == 1.0f);
  CHECK(HalfToFloat(0xC000) == -2.0f);
  CHECK(HalfToFloat(0x7BFF) == 65504.0f);
  CHECK(HalfToFloat(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(HalfToFloat(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(SameBits(HalfToFloat(0x8000), -0.0f));
  CHECK(std::isnan(HalfToFloat(0x7E00)));
  CHECK(std::isnan(HalfToFloat(0x7C01)));  // Signalling payload stays NaN.

  CHECK(Bf16ToFloat(0x3F80) == 1.0f);
  CHECK(Bf16ToFloat(0x0001) == std::ldexp(1.0f, -133));  // F32 subnormal.
  CHECK(Bf16ToFloat(0x7F7F) == std::ldexp(255.0f, 120));  // Max.
  CHECK(Bf16ToFloat(0xFF80) == -std::numeric_limits<float>::infinity());
  CHECK(SameBits(Bf16ToFloat(0x8000), -0.0f));
  CHECK(std::isnan(Bf16ToFloat(0x7FC0)));
}

TEST_CASE("F16 encode: every value round-trips, midpoints tie to even") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToHalf(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(HalfToFloat(back)));
      REQUIRE((back & 0x8000) == (h & 0x8000));
      continue;
    }
    REQUIRE(back == h);
  }
  // Between each pair of adjacent finite positive values (subnormals
  // included) the midpoint, exact in F32, goes to the even one; a hair off it
  // goes to the nearer.
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // Exact; (lo + hi) / 2 overflows near max.
    INFO("h=" << h);
    REQUIRE(FloatToHalf(mid) == ((h & 1) ? h + 1 : h));
    REQUIRE(FloatToHalf(std::nextafter(mid, 0.0f)) == h);
    REQUIRE(FloatToHalf(std::nextafter(mid, hi)) == h + 1);
    REQUIRE(FloatToHalf(-mid) == (0x8000 | ((h & 1) ? h + 1 : h)));
  }
  CHECK(FloatToHalf(65519.996f) == 0x7BFF);
  CHECK(FloatToHalf(65520.0f) == 0x7C00);  // Ties to even overflow to inf.
  CHECK(FloatToHalf(1e10f) == 0x7C00);
  CHECK(FloatToHalf(-1e10f) == 0xFC00);
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // Tie to even zero.
  CHECK(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(FloatToHalf(-1e-30f) == 0x8000);
  CHECK(FloatToHalf(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
}

TEST_CASE("BF16 encode: every value round-trips, midpoints tie to even") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToBf16(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(Bf16ToFloat(back)));
      continue;
    }
    REQUIRE(back == h);
  }
  for (uint32_t h = 0; h < 0x7F7F; ++h) {
    const float lo = Bf16ToFloat(static_cast<uint16_t>(h));
    const float hi = Bf16ToFloat(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // Exact; (lo + hi) / 2 overflows near max.
    INFO("h=" << h);
    REQUIRE(FloatToBf16(mid) == ((h & 1) ? h + 1 : h));
    REQUIRE(FloatToBf16(std::nextafter(mid, 0.0f)) == h);
    REQUIRE(FloatToBf16(std::nextafter(mid, hi)) == h + 1);
  }
  CHECK(FloatToBf16(std::numeric_limits<float>::max()) == 0x7F80);  // Rounds up to inf.
  // A NaN whose payload sits only in the dropped bits must not become inf.
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7F800001u)))));
}

TEST_CASE("quantized blocks, hand-checked: the scale, the nibble order and the zero point") {
  // Q8: one block of 32 (k = 3, the rest padding), scale 0.25.
  HostWeights q8{.dtype = DType::kQ8, .n = 1, .k = 3, .values = std::vector<uint8_t>(32), .scales = {0.25f}};
  q8.values[0] = static_cast<uint8_t>(int8_t{-3});
  q8.values[1] = 127;
  q8.values[2] = static_cast<uint8_t>(int8_t{-127});
  CHECK(Dequantize(q8.view()) == std::vector<float>{-0.75f, 31.75f, -31.75f});

  // Q4: byte i holds element i (low nibble) and i + 16 (high); w = (q - 8) x scale.
  HostWeights q4{.dtype = DType::kQ4, .n = 1, .k = 32, .values = std::vector<uint8_t>(16, 0x88),
                 .scales = {0.5f}};
  q4.values[0] = 0xf0;  // element 0: 0 -> -4, element 16: 15 -> 3.5
  q4.values[5] = 0x19;  // element 5: 9 -> 0.5, element 21: 1 -> -3.5
  std::vector<float> want4(32, 0.0f);
  want4[0] = -4.0f;
  want4[16] = 3.5f;
  want4[5] = 0.5f;
  want4[21] = -3.5f;
  CHECK(Dequantize(q4.view()) == want4);

  // Q4Z: two rows of two blocks (k = 40): w = (q - zero) x scale per block.
  HostWeights qz{.dtype = DType::kQ4Z, .n = 2, .k = 40, .values = std::vector<uint8_t>(64, 0x00),
                 .scales = {1.0f, 2.0f, 0.5f, 4.0f},
                 .zeros = {0, 3, 15, 1}};
  qz.values[16] = 0x52;  // row 0, block 1, byte 0: element 32: 2 -> (2 - 3) x 2 = -2; element 48 is padding
  qz.values[32] = 0x0f;  // row 1, block 0: element 0: 15 -> 0; element 16: 0 -> -7.5
  const std::vector<float> dz = Dequantize(qz.view());
  CHECK(dz[0] == 0.0f);
  CHECK(dz[32] == -2.0f);
  CHECK(dz[33] == -6.0f);  // nibble 0, zero 3, scale 2
  CHECK(dz[40 + 0] == 0.0f);
  CHECK(dz[40 + 16] == -7.5f);
  CHECK(dz[40 + 1] == -7.5f);
  CHECK(dz[40 + 32] == -4.0f);  // block 1 of row 1: (0 - 1) x 4
}

double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return num / den;
}

TEST_CASE("quantizing: the error each format costs, its bytes, and values on its grid stay put") {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 0.02f);
  const int64_t n = 64, k = 200;  // k off the block: a padded last block.
  std::vector<float> w(n * k);
  for (float& x : w) x = d(rng);
  struct Case {
    DType dtype;
    double max_nmse, min_nmse;  // Around the format's rounding: above zero, so it did quantize.
  };
  for (const Case& c : {Case{DType::kF32, 0, 0}, Case{DType::kBF16, 1e-5, 1e-7}, Case{DType::kF16, 1e-6, 1e-9},
                        Case{DType::kQ8, 1e-4, 1e-6}, Case{DType::kQ4, 2.5e-2, 2e-3},
                        Case{DType::kQ4Z, 2.5e-2, 2e-3}}) {
    INFO(DTypeName(c.dtype));
    const HostWeights q = QuantizeWeights(w.data(), n, k, c.dtype);
    CHECK(q.view().RowBytes() * n + static_cast<int64_t>(q.scales.size()) * 4 + static_cast<int64_t>(q.zeros.size()) ==
          q.bytes());
    // Each scale is an f16 value.
    for (float s : q.scales) CHECK(HalfToFloat(FloatToHalf(s)) == s);
    // Bytes as BitsPerWeight says, for k a whole number of blocks.
    const HostWeights whole = QuantizeWeights(w.data(), n, 192, c.dtype);
    CHECK(whole.bytes() * 8 == static_cast<int64_t>(BitsPerWeight(c.dtype) * n * 192));
    const std::vector<float> back = Dequantize(q.view());
    const double e = Nmse(back, w);
    CHECK(e <= c.max_nmse);
    CHECK(e >= c.min_nmse);
    // Quantizing what a format can hold exactly changes nothing (the
    // symmetric formats: each block's extreme is on the grid).
    if (c.dtype != DType::kQ4Z) {
      const HostWeights again = QuantizeWeights(back.data(), n, k, c.dtype);
      CHECK(Dequantize(again.view()) == back);
    }
  }
  CHECK(ParseDType("q4z") == DType::kQ4Z);
  CHECK_FALSE(ParseDType("fp8").has_value());
}

}  // namespace
}  // namespace duet::kernels

// What the kernel tests share: seeded inputs, the error measures they
// compare outputs by, and a KV pool holding given values.
//
//   const std::vector<float> x = kernels::testing::Random(n, /*seed=*/5);
//   CHECK(kernels::testing::Nmse(got, want) <= 1e-12);
#ifndef DUET_KERNELS_TESTING_OP_TESTING_H_
#define DUET_KERNELS_TESTING_OP_TESTING_H_

#include <cstdint>
#include <vector>

#include "kernels/kv_layout.h"

namespace duet::kernels::testing {

// n normal(0, scale) floats from `seed`.
std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f);
// max|a - b| / max|b| (the max itself where b is all zero); a and b of one size.
double MaxRelError(const std::vector<float>& a, const std::vector<float>& b);
// sum (a - b)^2 / sum b^2 (the sum itself where b is all zero): ggml's NMSE.
double Nmse(const std::vector<float>& a, const std::vector<float>& b);
bool SameBits(const float* a, const float* b, size_t n);
// A pool of layout `l` holding `values`, each rounded to l.dtype.
std::vector<uint8_t> PoolOf(const KvLayout& l, const std::vector<float>& values);

}  // namespace duet::kernels::testing

#endif  // DUET_KERNELS_TESTING_OP_TESTING_H_

#include "kernels/testing/op_testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "base/logging.h"

namespace duet::kernels::testing {

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double MaxRelError(const std::vector<float>& a, const std::vector<float>& b) {
  CHECK_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den == 0 ? num : num / den;
}

double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  CHECK_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? num : num / den;
}

bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

std::vector<uint8_t> PoolOf(const KvLayout& l, const std::vector<float>& values) {
  std::vector<uint8_t> pool(values.size() * static_cast<size_t>(l.ElementBytes()));
  l.Store(pool.data(), 0, values.data(), static_cast<int64_t>(values.size()));
  return pool;
}

}  // namespace duet::kernels::testing

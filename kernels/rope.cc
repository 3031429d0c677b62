#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

namespace duet::kernels {

std::vector<float> RopeInvFreq(const RopeConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    // HF: 1 / theta ** (arange(0, dim, 2).float() / dim), in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(config.theta), exponent);
    if (config.linear_factor != 1.0) inv_freq[i] = static_cast<float>(inv_freq[i] / config.linear_factor);
  }
  if (config.yarn_factor > 0) {
    // Hugging Face's _compute_yarn_parameters: the correction range in
    // double, the ramp and the blend in float32.
    const double dim = config.head_dim, base = config.theta, orig = config.yarn_original_max_position;
    const auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = correction_dim(config.yarn_beta_fast), high = correction_dim(config.yarn_beta_slow);
    if (config.yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float pos = std::pow(static_cast<float>(config.theta), static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrapolation = 1.0f / pos;
      const float interpolation = 1.0f / (static_cast<float>(config.yarn_factor) * pos);
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                        static_cast<float>(high - low), 0.0f, 1.0f);
      const float extra = 1.0f - ramp;  // The share that keeps the original frequency.
      inv_freq[i] = interpolation * (1.0f - extra) + extrapolation * extra;
    }
  }
  if (config.llama3_factor > 0) {
    const double factor = config.llama3_factor;
    const double low = config.llama3_low_freq_factor;
    const double high = config.llama3_high_freq_factor;
    const double old_len = config.llama3_original_max_position;
    const double low_freq_wavelen = old_len / low;
    const double high_freq_wavelen = old_len / high;
    for (int i = 0; i < half; ++i) {
      double f = inv_freq[i];
      double wavelen = 2.0 * M_PI / f;
      double scaled;
      if (wavelen < high_freq_wavelen) {
        scaled = f;
      } else if (wavelen > low_freq_wavelen) {
        scaled = f / factor;
      } else {
        double smooth = (old_len / wavelen - low) / (high - low);
        scaled = (1.0 - smooth) * f / factor + smooth * f;
      }
      inv_freq[i] = static_cast<float>(scaled);
    }
  }
  return inv_freq;
}

}  // namespace duet::kernels

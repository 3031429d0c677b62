#include "kernels/rope.h"

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

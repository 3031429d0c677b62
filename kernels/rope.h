// Rotary position embedding parameters shared by every backend.
//
//   RopeConfig rc{.head_dim = 64, .theta = 500000};
//   std::vector<float> inv_freq = RopeInvFreq(rc);
//
// The inverse frequencies are computed once per model on the host (with
// Llama-3's rope_scaling when set) and handed to the Rope op of any backend.
#ifndef DUET_KERNELS_ROPE_H_
#define DUET_KERNELS_ROPE_H_

#include <vector>

namespace duet::kernels {

struct RopeConfig {
  int head_dim = 0;
  double theta = 10000.0;
  // Llama-3 "rope_scaling" ({"rope_type": "llama3", ...}); off when factor <= 0.
  double llama3_factor = 0.0;
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  double llama3_original_max_position = 8192.0;
  // "rope_scaling": {"rope_type": "linear", "factor": f}: every frequency / f.
  double linear_factor = 1.0;
};

// head_dim / 2 inverse frequencies, as Hugging Face computes them (float32).
std::vector<float> RopeInvFreq(const RopeConfig& config);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_ROPE_H_

// Rotary position embedding parameters shared by every backend.
//
//   RopeConfig rc{.head_dim = 64, .theta = 500000};
//   std::vector<float> inv_freq = RopeInvFreq(rc);
//
// The inverse frequencies are computed once per model on the host (with
// Llama-3's, linear or yarn rope_scaling when set) and handed to the Rope op
// of any backend.
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
  // "rope_scaling": {"rope_type": "yarn", ...} (Qwen3's long context): the
  // frequencies blended between the original and factor-times slower ones
  // over the dimensions whose rotations at the original context lie
  // between beta_slow and beta_fast; off when yarn_factor <= 0.
  // yarn_attention_factor multiplies cos and sin (so the attention's scores
  // by its square): the config's attention_factor, else 0.1 ln(factor) + 1
  // (or DeepSeek's mscale / mscale_all_dim ratio of that).
  double yarn_factor = 0.0;
  double yarn_original_max_position = 0.0;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  bool yarn_truncate = true;
  double yarn_attention_factor = 1.0;
  // What the attention's scores are multiplied by for this RoPE (yarn's
  // factor squared; 1 otherwise).
  double ScoreFactor() const { return yarn_factor > 0 ? yarn_attention_factor * yarn_attention_factor : 1.0; }
};

// head_dim / 2 inverse frequencies, as Hugging Face computes them (float32).
std::vector<float> RopeInvFreq(const RopeConfig& config);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_ROPE_H_

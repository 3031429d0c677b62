#include "kernels/moe.h"

#include <algorithm>
#include <cmath>

namespace duet::kernels {

void RouteRow(const float* scores, int64_t num_experts, int64_t top_k, bool renormalize, int32_t* experts,
              float* weights) {
  // The softmax in float, as Hugging Face computes the routing weights.
  float mx = scores[0];
  for (int64_t e = 1; e < num_experts; ++e) mx = std::max(mx, scores[e]);
  float z = 0;
  for (int64_t e = 0; e < num_experts; ++e) z += std::exp(scores[e] - mx);
  // Selection of the top_k by score (the softmax keeps their order), each
  // pass the largest not yet taken, the lower index on a tie.
  float chosen = 0;
  for (int64_t j = 0; j < top_k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (std::find(experts, experts + j, static_cast<int32_t>(e)) != experts + j) continue;
      if (best < 0 || scores[e] > scores[best]) best = static_cast<int32_t>(e);
    }
    experts[j] = best;
    weights[j] = std::exp(scores[best] - mx) / z;
    chosen += weights[j];
  }
  if (renormalize) {
    for (int64_t j = 0; j < top_k; ++j) weights[j] /= chosen;
  }
}

MoeScratch MoeScratchFor(int64_t rows, int64_t top_k, int64_t num_experts, int64_t hidden, int64_t inter) {
  MoeScratch s;
  s.pairs = rows * top_k;
  const auto take = [&](int64_t bytes) {
    const int64_t at = s.bytes;
    s.bytes += (bytes + 63) / 64 * 64;
    return at;
  };
  s.expert = take(s.pairs * 4);
  s.weight = take(s.pairs * 4);
  s.slot = take(s.pairs * 4);
  s.first = take((num_experts + 1) * 4);
  s.xs = take(s.pairs * hidden * 4);
  s.gu = take(s.pairs * 2 * inter * 4);
  s.act = take(s.pairs * inter * 4);
  s.ys = take(s.pairs * hidden * 4);
  return s;
}

}  // namespace duet::kernels

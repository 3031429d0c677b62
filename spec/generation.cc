#include "spec/generation.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::spec {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(min_p >= 0 && min_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (logprobs < 0) return absl::InvalidArgumentError("logprobs must be >= 0");
  for (auto [name, v] : {std::pair<const char*, float>{"presence_penalty", presence_penalty},
                         {"frequency_penalty", frequency_penalty}}) {
    if (!(v >= -2 && v <= 2)) {
      return absl::InvalidArgumentError(absl::StrCat("penalties must be in [-2, 2]: ", name, " is ", v));
    }
  }
  return absl::OkStatus();
}

absl::Status GenerationParams::Validate() const {
  RETURN_IF_ERROR(sampling.Validate());
  if (max_tokens < 1) return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  return absl::OkStatus();
}

FinishDecision FinishAfter(const GenerationParams& p, const ModelConfig& config, int64_t generated,
                           int64_t position, int32_t token) {
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  const bool eos = !p.ignore_eos && config.IsEos(token) && generated >= p.min_tokens;
  if (eos || stop_id) return FinishDecision::kStop;
  if (generated >= p.max_tokens) return FinishDecision::kLength;
  // The context is a hard limit on prompt + completion: a token sampled at
  // the context's last position fills it, and no position is left for
  // another (feeding this one would only sample past the limit).
  if (position + 1 >= config.max_position_embeddings) return FinishDecision::kLength;
  return FinishDecision::kContinue;
}

FinishDecision ResumedEnd(const GenerationParams& params, const ModelConfig& config, int64_t prompt_tokens,
                          absl::Span<const int32_t> resumed) {
  if (resumed.empty()) return FinishDecision::kContinue;
  const int64_t n = static_cast<int64_t>(resumed.size());
  return FinishAfter(params, config, /*generated=*/n, /*position=*/prompt_tokens + n - 1, resumed.back());
}

}  // namespace duet::spec

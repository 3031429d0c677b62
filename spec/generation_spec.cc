#include "spec/generation_spec.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace duet::spec {

absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, const char* field,
                           int64_t vocab_size) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

proto::FinishReason FinishReasonOf(FinishDecision end) {
  CHECK(end != FinishDecision::kContinue) << "a request that goes on has no finish reason";
  return end == FinishDecision::kStop ? proto::FINISH_STOP : proto::FINISH_LENGTH;
}

spec::GenerationParams ToGenerationParams(const proto::GenerationSpec& spec) {
  const proto::SamplingParams& s = spec.sampling();
  spec::GenerationParams p;
  p.sampling = {.temperature = s.temperature(),
                .top_k = s.top_k(),
                .top_p = s.top_p(),
                .min_p = s.min_p(),
                .seed = s.seed(),
                .logprobs = s.logprobs(),
                .presence_penalty = s.presence_penalty(),
                .frequency_penalty = s.frequency_penalty()};
  p.max_tokens = spec.max_tokens();
  p.stop_token_ids.assign(spec.stop_token_ids().begin(), spec.stop_token_ids().end());
  p.ignore_eos = spec.ignore_eos();
  p.min_tokens = spec.min_tokens();
  p.choice_index = spec.choice_index();
  return p;
}

absl::StatusOr<spec::GenerationParams> ParamsFromSpec(const proto::GenerationSpec& spec,
                                                        const spec::ModelConfig& config) {
  if (spec.prompt_ids().empty()) return absl::InvalidArgumentError("the prompt is empty");
  RETURN_IF_ERROR(CheckTokenIds(spec.prompt_ids(), "prompt_ids", config.vocab_size));
  int32_t last = 0;
  for (int32_t b : spec.cache_boundaries()) {
    if (b <= last || b > spec.prompt_ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat("cache_boundaries must rise within the prompt's ",
                                                     spec.prompt_ids_size(), " tokens, got ", b));
    }
    last = b;
  }
  spec::GenerationParams p = ToGenerationParams(spec);
  RETURN_IF_ERROR(p.Validate());
  return p;
}

}  // namespace duet::spec

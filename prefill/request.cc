#include "prefill/request.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::prefill {
namespace {

absl::Status CheckIds(const google::protobuf::RepeatedField<int32_t>& ids, const char* field,
                      int64_t vocab_size) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] = ", ids[i],
                                                     " is outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

engine::SamplingParams ToSamplingParams(const proto::SamplingParams& p) {
  return engine::SamplingParams{.temperature = p.temperature(),
                                .top_k = p.top_k(),
                                .top_p = p.top_p(),
                                .min_p = p.min_p(),
                                .seed = p.seed(),
                                .logprobs = p.logprobs(),
                                .presence_penalty = p.presence_penalty(),
                                .frequency_penalty = p.frequency_penalty()};
}

absl::Status ValidatePrefillRequest(const proto::PrefillRequest& request,
                                    const engine::ModelConfig& config) {
  const proto::GenerationSpec& spec = request.spec();
  if (spec.prompt_ids().empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int64_t n = spec.prompt_ids().size() + request.resume_ids().size();
  if (n > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", spec.prompt_ids().size(), " tokens",
        request.resume_ids().empty() ? "" : absl::StrCat(" (+", request.resume_ids().size(), " resumed)"),
        ", more than the model's context of ", config.max_position_embeddings));
  }
  RETURN_IF_ERROR(CheckIds(spec.prompt_ids(), "prompt_ids", config.vocab_size));
  RETURN_IF_ERROR(CheckIds(request.resume_ids(), "resume_ids", config.vocab_size));
  RETURN_IF_ERROR(ToSamplingParams(spec.sampling()).Validate());
  for (float penalty : {spec.sampling().presence_penalty(), spec.sampling().frequency_penalty()}) {
    if (!(penalty >= -2 && penalty <= 2)) {
      return absl::InvalidArgumentError(absl::StrCat("penalties must be in [-2, 2], got ", penalty));
    }
  }
  if (request.sibling_request_ids_size() > 0) {
    if (request.resume_ids_size() > 0) {
      return absl::InvalidArgumentError("a request with resumed tokens cannot have sibling choices");
    }
    if (request.sibling_request_ids_size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("at most 64 sibling choices, got ", request.sibling_request_ids_size()));
    }
    std::vector<uint64_t> ids(request.sibling_request_ids().begin(), request.sibling_request_ids().end());
    ids.push_back(request.request_id());
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
      return absl::InvalidArgumentError("sibling request ids must be distinct and differ from the request's");
    }
  }
  if (spec.max_tokens() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", spec.max_tokens()));
  }
  if (spec.min_tokens() < 0 || spec.min_tokens() > spec.max_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens must be in [0, max_tokens = ",
                                                   spec.max_tokens(), "], got ", spec.min_tokens()));
  }
  if (request.resume_ids().size() >= spec.max_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("resume_ids has ", request.resume_ids().size(),
                                                   " tokens: nothing is left of max_tokens = ",
                                                   spec.max_tokens()));
  }
  // A request whose first token cannot be its last needs somewhere to go.
  if (request.decode_address().empty() && request.resume_ids().size() + 1 < spec.max_tokens() &&
      n < config.max_position_embeddings) {
    return absl::InvalidArgumentError("decode_address is empty");
  }
  return absl::OkStatus();
}

FirstTokenEnd DecideFirstTokenEnd(const proto::PrefillRequest& request,
                                  const engine::ModelConfig& config, int32_t token) {
  const proto::GenerationSpec& spec = request.spec();
  const int64_t generated = request.resume_ids().size() + 1;  // Counting this token.
  const bool stop_id = std::find(spec.stop_token_ids().begin(), spec.stop_token_ids().end(), token) !=
                       spec.stop_token_ids().end();
  const bool eos = !spec.ignore_eos() && config.IsEos(token) && generated >= spec.min_tokens();
  if (eos || stop_id) return FirstTokenEnd::kStop;
  if (generated >= spec.max_tokens()) return FirstTokenEnd::kLength;
  // Generate's "context is full": the next token would need position n + 1.
  const int64_t pos = spec.prompt_ids().size() + request.resume_ids().size();
  if (pos + 1 > config.max_position_embeddings) return FirstTokenEnd::kLength;
  return FirstTokenEnd::kContinue;
}

}  // namespace duet::prefill

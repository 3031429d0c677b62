#include "prefill/request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spec/generation_spec.h"

namespace duet::prefill {

namespace {

// ValidatePrefillRequest's checks past the spec's own (spec::ParamsFromSpec).
absl::Status CheckPrefillRequest(const proto::PrefillRequest& request, const spec::ModelConfig& config) {
  const proto::GenerationSpec& spec = request.spec();
  const int64_t n = spec.prompt_ids().size() + request.resume_ids().size();
  if (n > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", spec.prompt_ids().size(), " tokens",
        request.resume_ids().empty() ? "" : absl::StrCat(" (+", request.resume_ids().size(), " resumed)"),
        ", more than the model's context of ", config.max_position_embeddings));
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

}  // namespace

absl::Status ValidatePrefillRequest(const proto::PrefillRequest& request, const spec::ModelConfig& config) {
  // A prompt past the context is refused as that before anything else.
  if (request.spec().prompt_ids().size() + request.resume_ids().size() <= config.max_position_embeddings) {
    RETURN_IF_ERROR(spec::ParamsFromSpec(request.spec(), config).status());
    RETURN_IF_ERROR(spec::CheckTokenIds(request.resume_ids(), "resume_ids", config.vocab_size));
  }
  return CheckPrefillRequest(request, config);
}

absl::StatusOr<AcceptedRequest> AcceptPrefillRequest(const proto::PrefillRequest& request,
                                                     const spec::ModelConfig& config) {
  AcceptedRequest a;
  ASSIGN_OR_RETURN(a.params, spec::ParamsFromSpec(request.spec(), config));
  RETURN_IF_ERROR(spec::CheckTokenIds(request.resume_ids(), "resume_ids", config.vocab_size));
  a.end = spec::ResumedEnd(a.params, config, request.spec().prompt_ids_size(), request.resume_ids());
  if (a.end == spec::FinishDecision::kContinue) RETURN_IF_ERROR(CheckPrefillRequest(request, config));
  return a;
}

spec::FinishDecision DecideFirstTokenEnd(const proto::PrefillRequest& request,
                                           const spec::GenerationParams& params,
                                           const spec::ModelConfig& config, int32_t token) {
  const int64_t resumed = request.resume_ids().size();
  return spec::FinishAfter(params, config, /*generated=*/resumed + 1,
                             /*position=*/request.spec().prompt_ids().size() + resumed, token);
}

}  // namespace duet::prefill

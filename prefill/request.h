// The rules a prefill worker applies to one PrefillRequest: is it valid for
// this model, and whether its first token already ends it. Pure functions, so
// the service and its tests share them.
//
//   RETURN_IF_ERROR(ValidatePrefillRequest(request, model.config()));
//   engine::GenerationParams params = worker::ToGenerationParams(request.spec());
//   engine::FinishDecision end = DecideFirstTokenEnd(request, params, config, s.token);
//
// The end rule is engine::FinishAfter, the one engine::Generate (the
// reference the cluster must reproduce) and the decode batch apply; tokens
// an earlier attempt generated (resume_ids) count toward max_tokens and
// min_tokens.
#ifndef DUET_PREFILL_REQUEST_H_
#define DUET_PREFILL_REQUEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "engine/generation.h"
#include "proto/control.pb.h"

namespace duet::prefill {

// InvalidArgument with a message naming the offending field: prompt + resume
// longer than the model's context, what worker::ParamsFromSpec refuses (an
// empty prompt, an id outside the vocabulary, bad sampling parameters,
// max_tokens < 1, min_tokens outside [0, max_tokens]), a resumed id outside
// the vocabulary, resume_ids not shorter than max_tokens, or no
// decode_address when the request may need a decode.
absl::Status ValidatePrefillRequest(const proto::PrefillRequest& request,
                                    const engine::ModelConfig& config);

// Whether `token`, this attempt's first (sampled at position len(prompt) +
// len(resume)), ends the request: engine::FinishAfter, with the resumed
// tokens counted toward max_tokens and min_tokens. `params` are the spec's
// (worker::ToGenerationParams).
engine::FinishDecision DecideFirstTokenEnd(const proto::PrefillRequest& request,
                                           const engine::GenerationParams& params,
                                           const engine::ModelConfig& config, int32_t token);

}  // namespace duet::prefill

#endif  // DUET_PREFILL_REQUEST_H_

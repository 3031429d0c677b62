// The rules a prefill worker applies to one PrefillRequest: is it valid for
// this model, did its resumed tokens already end it, and does its first token
// end it. Pure functions, so the service and its tests share them.
//
//   ASSIGN_OR_RETURN(AcceptedRequest a, AcceptPrefillRequest(request, model.config()));
//   if (a.end != spec::FinishDecision::kContinue) { finish it; }
//   ... prefill, sample the first token with a.params ...
//   spec::FinishDecision end = DecideFirstTokenEnd(request, a.params, config, token);
//
// The end rule is spec::FinishAfter, the one engine::Generate (the
// reference the cluster must reproduce) and the decode batch apply; tokens
// an earlier attempt generated (resume_ids) count toward max_tokens and
// min_tokens.
#ifndef DUET_PREFILL_REQUEST_H_
#define DUET_PREFILL_REQUEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "spec/model_config.h"
#include "absl/status/statusor.h"
#include "spec/generation.h"
#include "proto/control.pb.h"

namespace duet::prefill {

// InvalidArgument with a message naming the offending field: prompt + resume
// longer than the model's context, what spec::ParamsFromSpec refuses (an
// empty prompt, an id outside the vocabulary, bad sampling parameters,
// max_tokens < 1, min_tokens outside [0, max_tokens]), a resumed id outside
// the vocabulary, resume_ids not shorter than max_tokens, or no
// decode_address when the request may need a decode.
absl::Status ValidatePrefillRequest(const proto::PrefillRequest& request,
                                    const spec::ModelConfig& config);

// A request a worker takes in: its parameters, converted once (the worker
// keeps them with the request), and whether its resumed tokens already ended
// it (spec::ResumedEnd: the attempt that sampled a stop, or the
// max_tokens-th token, died before its Finish), in which case it is finished,
// not prefilled.
struct AcceptedRequest {
  spec::GenerationParams params;
  spec::FinishDecision end = spec::FinishDecision::kContinue;
};

// The one conversion of a request's spec (spec::ParamsFromSpec) and the
// resumed end; when the request goes on, ValidatePrefillRequest's checks too
// (a request with nothing left to generate is ended, not refused).
// InvalidArgument as ValidatePrefillRequest, or for a resumed id outside the
// vocabulary.
absl::StatusOr<AcceptedRequest> AcceptPrefillRequest(const proto::PrefillRequest& request,
                                                     const spec::ModelConfig& config);

// Whether `token`, this attempt's first (sampled at position len(prompt) +
// len(resume)), ends the request: spec::FinishAfter, with the resumed
// tokens counted toward max_tokens and min_tokens. `params` are the
// request's (AcceptedRequest::params).
spec::FinishDecision DecideFirstTokenEnd(const proto::PrefillRequest& request,
                                           const spec::GenerationParams& params,
                                           const spec::ModelConfig& config, int32_t token);

}  // namespace duet::prefill

#endif  // DUET_PREFILL_REQUEST_H_

// The one conversion from the control plane's GenerationSpec to the engine's
// GenerationParams, which every worker (prefill, decode, colocated) uses.
//
//   ASSIGN_OR_RETURN(spec::GenerationParams p, ParamsFromSpec(spec, model.config()));
//
// Proto3 zeros are taken literally, not as defaults: the router sends
// top_p = 1 for "off", and a max_tokens of 0 is refused.
#ifndef DUET_SPEC_GENERATION_SPEC_H_
#define DUET_SPEC_GENERATION_SPEC_H_

#include "absl/status/statusor.h"
#include "spec/generation.h"
#include "spec/model_config.h"
#include "proto/control.pb.h"

namespace duet::spec {

// InvalidArgument "field[i] = id is outside the vocabulary of N" for the first
// id of `ids` that is not a token of the model.
absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, const char* field,
                           int64_t vocab_size);

// The Finish reason the workers report for a decision that ends a request
// (kStop or kLength; CHECK-fails on kContinue).
proto::FinishReason FinishReasonOf(FinishDecision end);

// The spec's parameters as they are, unchecked (for a spec checked before).
spec::GenerationParams ToGenerationParams(const proto::GenerationSpec& spec);

// ToGenerationParams, checked: InvalidArgument naming what is wrong (an
// empty prompt, a prompt id outside the vocabulary, or what
// GenerationParams::Validate refuses). The context's room is the caller's
// to check: a prefill and a decode hold different numbers of tokens.
absl::StatusOr<spec::GenerationParams> ParamsFromSpec(const proto::GenerationSpec& spec,
                                                        const spec::ModelConfig& config);

}  // namespace duet::spec

#endif  // DUET_SPEC_GENERATION_SPEC_H_

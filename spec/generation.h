// What a request asks of generation, and the one rule that says when a
// sampled token ends it. engine::Generate, the prefill worker's first token
// and the decode batch all decide with FinishAfter, so a request ends at the
// same token wherever it runs.
//
//   RETURN_IF_ERROR(params.Validate());
//   switch (FinishAfter(params, config, /*generated=*/n, /*position=*/pos, token)) { ... }
//
// Plain values: thread-compatible.
#ifndef DUET_SPEC_GENERATION_H_
#define DUET_SPEC_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "spec/model_config.h"

namespace duet::spec {

// How a token is drawn (engine/sampler.h applies it).
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy.
  int32_t top_k = 0;         // 0 = off.
  float top_p = 1.0f;        // 1 = off.
  float min_p = 0.0f;        // 0 = off.
  uint64_t seed = 0;
  int32_t logprobs = 0;      // Top alternatives to report per position.
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]

  // InvalidArgument naming the parameter when out of range.
  absl::Status Validate() const;
};

struct GenerationParams {
  SamplingParams sampling;
  // At least 1. "Until the context ends" is a caller's max_tokens that the
  // context reaches first (the router fills in what the context leaves).
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // Besides the config's EOS ids.
  bool ignore_eos = false;
  // An EOS does not end the request before it has this many generated
  // tokens (the token is still emitted); stop ids end it regardless.
  int64_t min_tokens = 0;
  uint64_t choice_index = 0;  // Which of a request's n choices: keys the sampler's draws.

  // InvalidArgument naming the parameter: sampling out of range,
  // max_tokens < 1, or min_tokens outside [0, max_tokens].
  absl::Status Validate() const;
};

enum class FinishDecision {
  kContinue,  // Feed the token and sample the next.
  kStop,      // An EOS (at or past min_tokens, unless ignore_eos) or a stop id: "stop".
  kLength,    // max_tokens reached, or the context has no room to feed it: "length".
};

// Whether `token` ends the request: it is the `generated`-th generated token
// (counting it and any an earlier attempt produced) and was sampled at
// `position` (the number of tokens before it). A stop beats a length.
FinishDecision FinishAfter(const GenerationParams& params, const ModelConfig& config, int64_t generated,
                           int64_t position, int32_t token);

// Whether the last of `resumed` (the tokens an earlier attempt generated
// after a prompt of `prompt_tokens`) already ended the request, as
// FinishAfter judged it there; kContinue when none were. A worker given
// such a request ends it at once: the attempt that sampled the stop died
// before its Finish reached the router, and computing on would generate
// past it.
FinishDecision ResumedEnd(const GenerationParams& params, const ModelConfig& config, int64_t prompt_tokens,
                          absl::Span<const int32_t> resumed);

}  // namespace duet::spec

#endif  // DUET_SPEC_GENERATION_H_

// Token sampling: greedy, temperature, top-k, top-p, min-p, presence and
// frequency penalties, and logprobs.
//
//   spec::SamplingParams p{.temperature = 0.8f, .top_p = 0.95f, .seed = 42};
//   SampleResult r = Sample(logits.row(i), vocab, p, /*choice=*/0, /*position=*/n);
//
// Logprobs are the log-softmax of the raw logits, before temperature and
// filtering (what OpenAI and vLLM report). Penalties follow OpenAI: a
// token's logit drops by frequency_penalty * (times it was generated) +
// presence_penalty * (1 if it was), counting only `generated` (this choice's
// output so far, not the prompt); they shape sampling, not the reported
// logprobs. The random draw for a token is a
// pure function of (seed, choice index, position): a counter-based generator
// (Philox-4x32-10), so a request samples the same tokens whether one process
// or two (prefill, then decode) produce them, and in any batch.
#ifndef DUET_ENGINE_SAMPLER_H_
#define DUET_ENGINE_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "spec/generation.h"

namespace duet::engine {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0;  // Of the chosen token, from the raw logits.
  std::vector<std::pair<int32_t, float>> top_logprobs;  // Best first.
};

// `allowed`, when given, is a token mask (bit id % 64 of word id / 64; ids
// past it are not allowed), as a grammar's matcher fills it: the choice is
// made among the allowed tokens only (after penalties, before temperature
// and filtering); logprobs stay those of the raw logits. With no token
// allowed the result's token is -1.
SampleResult Sample(const float* logits, int64_t vocab_size, const spec::SamplingParams& params,
                    uint64_t choice_index, int64_t position,
                    absl::Span<const int32_t> generated = {}, absl::Span<const uint64_t> allowed = {});

// A uniform draw in [0, 1) keyed by (seed, choice, position).
double UniformDraw(uint64_t seed, uint64_t choice_index, int64_t position);

}  // namespace duet::engine

#endif  // DUET_ENGINE_SAMPLER_H_

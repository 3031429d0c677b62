// One request, start to finish, on one engine: prefill (optionally in
// chunks), then decode until FinishAfter (generation.h) ends it.
//
//   GenerateOptions opt;
//   opt.max_tokens = 32;
//   ASSIGN_OR_RETURN(GenerateResult r, Generate(*model, pool, prompt_ids, opt));
//
// This is `duet generate` and the reference the serving path is tested
// against. Its KV blocks come from `pool` and all return to it before the
// call ends, whatever the outcome.
#ifndef DUET_ENGINE_GENERATOR_H_
#define DUET_ENGINE_GENERATOR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_pool.h"
#include "spec/generation.h"
#include "engine/model.h"
#include "engine/sampler.h"

namespace duet::engine {

// A request's parameters (generation.h) and how the reference runs it.
struct GenerateOptions : spec::GenerationParams {
  int64_t prefill_chunk = 0;  // 0: the whole prompt in one step.
  // The model the prompt runs on and the first token is sampled from, as a
  // disaggregated cluster's prefill pool does; null: `model` itself. It must
  // share `model`'s config and write `pool`'s KV layout (a pool per phase may
  // load its own precision map, never its own KV dtype).
  Model* prefill_model = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> ids;  // Generated tokens only.
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;  // Per generated token.
  std::string finish_reason;  // "stop" (EOS or stop id) or "length".
};

absl::StatusOr<GenerateResult> Generate(Model& model, BlockPool& pool,
                                        absl::Span<const int32_t> prompt,
                                        const GenerateOptions& options);

}  // namespace duet::engine

#endif  // DUET_ENGINE_GENERATOR_H_

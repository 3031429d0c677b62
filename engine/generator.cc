#include "engine/generator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::engine {

absl::StatusOr<GenerateResult> Generate(Model& model, BlockPool& pool,
                                        absl::Span<const int32_t> prompt,
                                        const GenerateOptions& options) {
  const spec::ModelConfig& c = model.config();
  RETURN_IF_ERROR(options.Validate());
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", n,
                                                   " tokens, more than the model's context of ",
                                                   c.max_position_embeddings));
  }
  Model& prefill = options.prefill_model != nullptr ? *options.prefill_model : model;
  if (prefill.kv_dtype() != model.kv_dtype() || prefill.config().num_layers != c.num_layers ||
      prefill.config().vocab_size != c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prefill model (KV ", kernels::DTypeName(prefill.kv_dtype()), ", ",
                     prefill.config().num_layers, " layers) does not match the decode model (KV ",
                     kernels::DTypeName(model.kv_dtype()), ", ", c.num_layers, " layers)"));
  }
  GenerateResult result;

  SequenceKv seq(&pool);
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n;
  Logits logits;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    RETURN_IF_ERROR(seq.Reserve(start + len));
    BatchSeq b{.tokens = prompt.subspan(start, len), .start_pos = start,
               .block_table = seq.block_table()};
    if (start + len == n) b.logit_rows = {static_cast<int32_t>(len - 1)};
    ASSIGN_OR_RETURN(logits, prefill.Forward({b}, pool));
  }
  int64_t pos = n;  // Position of the token being sampled.
  while (true) {
    SampleResult s = Sample(logits.row(0), c.vocab_size, options.sampling, options.choice_index, pos,
                            result.ids);
    result.ids.push_back(s.token);
    result.logprobs.push_back(s.logprob);
    result.top_logprobs.push_back(std::move(s.top_logprobs));
    const spec::FinishDecision end =
        spec::FinishAfter(options, c, static_cast<int64_t>(result.ids.size()), pos, s.token);
    if (end != spec::FinishDecision::kContinue) {
      result.finish_reason = end == spec::FinishDecision::kStop ? "stop" : "length";
      break;
    }
    RETURN_IF_ERROR(seq.Reserve(pos + 1));
    const int32_t tok = s.token;
    BatchSeq b{.tokens = absl::MakeConstSpan(&tok, 1), .start_pos = pos,
               .block_table = seq.block_table(), .logit_rows = {0}};
    ASSIGN_OR_RETURN(logits, model.Forward({b}, pool));
    ++pos;
  }
  return result;
}

}  // namespace duet::engine

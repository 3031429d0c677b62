// A model whose greedy next token is forced: a copy of a BF16 checkpoint
// with every attention and MLP output zeroed (o_proj, down_proj), so the
// last hidden state is the last token's embedding; each token `next` maps
// from gets a one-hot embedding of its own, and the LM head row of its
// successor the same one-hot, so greedy sampling always picks the successor
// (any other token's logits are 0). For dense llama-family checkpoints.
//
//   ASSIGN_OR_RETURN(std::string dir, WriteForcedModel(TinyModelDir("qwen3"), FreshDir("forced"), {{5, 9}, {9, 2}}));
#ifndef DUET_ENGINE_TESTING_FORCED_MODEL_H_
#define DUET_ENGINE_TESTING_FORCED_MODEL_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace duet::testing {

// Writes into `dst` (every file of `src`, model.safetensors forced); returns
// `dst`. InvalidArgument when a tensor is not BF16, the model's LM head is
// tied, or `next` has more entries than the hidden size.
absl::StatusOr<std::string> WriteForcedModel(const std::string& src, const std::string& dst,
                                             const std::map<int32_t, int32_t>& next);

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_FORCED_MODEL_H_

// Writes complete Hugging Face model directories with deterministic random
// weights: the embedded tiny model, the `bench` model, and test fixtures.
//
//   MakeModelOptions o{.size = "tiny", .arch = "llama", .out_dir = dir};
//   RETURN_IF_ERROR(MakeModel(o));
//
// A directory holds config.json, model.safetensors, tokenizer.json and
// tokenizer_config.json. Each arch exercises its own feature: llama is untied
// with Llama-3 rope_scaling (BF16 weights), mistral has a sliding window
// shorter than test prompts (F16), qwen2 has q/k/v bias and tied embeddings
// (F32), qwen3 has q/k norms and a head_dim of its own (BF16), gemma3_text
// has Gemma-3's norms and local/global layers (BF16), qwen3_moe is qwen3
// with experts (tiny: 8, top 2, unnormalised, layer 1 dense by
// mlp_only_layers; bench: 16, top 4, renormalised, the active parameters of
// the bench qwen3), mixtral has 8 experts, top 2, in every layer (BF16).
// The tokenizer is a byte-level BPE learned from duet's own corpus, or the
// real one tokenizer_dir names.
// Same options, same bytes.
#ifndef DUET_ENGINE_TESTING_MODEL_MAKER_H_
#define DUET_ENGINE_TESTING_MODEL_MAKER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace duet::testing {

struct MakeModelOptions {
  std::string size = "tiny";  // tiny | bench
  std::string arch = "llama"; // llama | mistral | qwen2 | qwen3 | gemma3_text | qwen3_moe | mixtral
  uint64_t seed = 0;
  std::string out_dir;
  // A real tokenizer's directory: its tokenizer.json and tokenizer_config.json
  // (and its chat template) go into the model in place of the trained BPE,
  // the vocabulary is the tokenizer's, and the EOS and BOS ids are its
  // eos_token's and bos_token's.
  std::string tokenizer_dir;
};

absl::Status MakeModel(const MakeModelOptions& options);

// The served model name a directory implies: its last path component
// ("/models/tiny-llama/" -> "tiny-llama").
std::string ModelBaseName(const std::string& dir);

// duet's cache folder: $XDG_CACHE_HOME/duet, else ~/.cache/duet.
std::string CacheDir();

// The embedded tiny model (or another size/arch), made on first use in the
// cache folder; returns its directory. Safe against concurrent first use by
// several processes (built in a temporary folder, then renamed).
absl::StatusOr<std::string> EnsureCachedModel(const std::string& size = "tiny",
                                              const std::string& arch = "llama");

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_MODEL_MAKER_H_

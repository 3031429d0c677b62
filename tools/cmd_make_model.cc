#include <cstdio>
#include <optional>

#include "base/flags.h"
#include "tools/commands.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {

int RunMakeModel(int argc, char** argv) {
  FlagSet f("duet make-model",
            "Writes a complete Hugging Face model directory (config.json, model.safetensors,\n"
            "tokenizer.json, tokenizer_config.json) with deterministic random weights.\n"
            "tiny: a few million parameters, vocabulary 1024. bench: about 125M parameters,\n"
            "12 layers, hidden 768, GQA 12/4 heads, vocabulary 32000.");
  f.String("size", "tiny", "tiny | bench");
  f.String("out", "", "output directory (required)");
  f.String("arch", "llama",
           "llama (untied, Llama-3 rope_scaling) | mistral (sliding window) | qwen2 (q/k/v bias, tied) | qwen3 (q/k "
           "norms, head_dim of its own) | gemma3_text (local and global layers, GELU-tanh, four norms) | qwen3_moe "
           "(qwen3 with experts: tiny 8, top 2, layer 1 dense; bench 16, top 4) | mixtral (8 experts, top 2)");
  f.String("tokenizer", "",
           "a real tokenizer's directory (tokenizer.json, tokenizer_config.json): copied in with its chat template "
           "in place of the trained BPE; the vocabulary and EOS/BOS ids are its");
  f.Int("seed", 0, "weight seed; same seed, same bytes");
  if (std::optional<int> exit = ParseFlagsOrExit(f, argc, argv)) return *exit;
  if (f.GetString("out").empty()) {
    std::fprintf(stderr, "duet make-model: --out is required\n");
    return 2;
  }
  std::fprintf(stderr, "duet make-model: writing the %s %s model to %s\n", f.GetString("size").c_str(),
               f.GetString("arch").c_str(), f.GetString("out").c_str());
  absl::Status s = testing::MakeModel({.size = f.GetString("size"), .arch = f.GetString("arch"),
                 .seed = static_cast<uint64_t>(f.GetInt("seed")), .out_dir = f.GetString("out"),
                 .tokenizer_dir = f.GetString("tokenizer")});
  if (!s.ok()) {
    std::fprintf(stderr, "duet make-model: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "duet make-model: done\n");
  return 0;
}

}  // namespace duet::tools

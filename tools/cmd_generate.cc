#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "engine/block_pool.h"
#include "text/chat_template.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "text/tokenizer.h"
#include "kernels/factory.h"
#include "tools/commands.h"
#include "tools/load_flags.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt-ids: \"", part, "\" is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids is empty");
  return ids;
}

absl::StatusOr<std::vector<text::ChatMessage>> ParseChat(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::InvalidArgumentError("--chat must be a JSON array of {\"role\", \"content\"} objects");
  }
  std::vector<text::ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat: message ", i, " needs string fields \"role\" and \"content\""));
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

absl::Status Generate(const FlagSet& f) {
  std::string dir = f.GetString("model");
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, testing::EnsureCachedModel("tiny", "llama"));
  }
  const int given = f.IsSet("prompt-ids") + f.IsSet("prompt") + f.IsSet("chat");
  if (given != 1) return absl::InvalidArgumentError("give exactly one of --prompt-ids, --prompt, --chat");
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::vector<int32_t> prompt;
  if (f.IsSet("prompt-ids")) {
    ASSIGN_OR_RETURN(prompt, ParseIds(f.GetString("prompt-ids")));
  } else {
    ASSIGN_OR_RETURN(tokenizer, text::Tokenizer::Load(dir));
    ASSIGN_OR_RETURN(text::PromptFormat format, text::PromptFormat::Load(dir));
    std::string text;
    if (f.IsSet("prompt")) {
      text = format.CompletionPrefix() + f.GetString("prompt");
    } else {
      ASSIGN_OR_RETURN(std::vector<text::ChatMessage> messages, ParseChat(f.GetString("chat")));
      ASSIGN_OR_RETURN(text, format.RenderChat(messages, /*add_generation_prompt=*/true));
    }
    ASSIGN_OR_RETURN(prompt, tokenizer->Encode(text));
  }

  engine::GenerateOptions opt;
  opt.max_tokens = f.GetInt("max-tokens");
  opt.ignore_eos = f.GetBool("ignore-eos");
  opt.prefill_chunk = f.GetInt("prefill-chunk");
  opt.sampling.temperature = static_cast<float>(f.GetDouble("temperature"));
  opt.sampling.top_p = static_cast<float>(f.GetDouble("top-p"));
  opt.sampling.top_k = static_cast<int32_t>(f.GetInt("top-k"));
  opt.sampling.min_p = static_cast<float>(f.GetDouble("min-p"));
  opt.sampling.logprobs = static_cast<int32_t>(f.GetInt("logprobs"));
  opt.sampling.presence_penalty = static_cast<float>(f.GetDouble("presence-penalty"));
  opt.sampling.frequency_penalty = static_cast<float>(f.GetDouble("frequency-penalty"));
  opt.sampling.seed = f.IsSet("seed") ? static_cast<uint64_t>(f.GetInt("seed")) : std::random_device{}();
  if (opt.max_tokens < 1) return absl::InvalidArgumentError("--max-tokens must be >= 1");
  RETURN_IF_ERROR(opt.Validate());

  ASSIGN_OR_RETURN(const engine::LoadOptions load, LoadOptionsFromFlags(f));
  ASSIGN_OR_RETURN(kernels::KernelBackendPtr backend,
                   kernels::NewBackend(load.Backend(static_cast<int>(f.GetInt("threads")))));
  ASSIGN_OR_RETURN(auto model, engine::Model::Load(dir, backend.get(), load));
  const int64_t bs = f.GetInt("block-size");
  if (bs <= 0) return absl::InvalidArgumentError("--block-size must be > 0");
  const int64_t tokens = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + opt.max_tokens + 1,
                                           model->config().max_position_embeddings + 1);
  engine::BlockPool pool(model->KvLayoutFor(bs), (tokens + bs - 1) / bs, backend->DefaultBufferType());
  ASSIGN_OR_RETURN(engine::GenerateResult r, engine::Generate(*model, pool, prompt, opt));

  std::string text;
  if (tokenizer == nullptr) {
    // Text needs a tokenizer; a model directory without one still generates ids.
    auto t = text::Tokenizer::Load(dir);
    if (t.ok()) tokenizer = std::move(*t);
  }
  if (tokenizer != nullptr) {
    ASSIGN_OR_RETURN(text, tokenizer->Decode(r.ids, /*skip_special=*/true));
  }
  if (f.GetBool("json")) {
    nlohmann::json j;
    j["ids"] = r.ids;
    j["text"] = text;
    j["finish_reason"] = r.finish_reason;
    j["top_logprobs"] = nlohmann::json::array();
    for (const auto& pos : r.top_logprobs) {
      nlohmann::json alts = nlohmann::json::array();
      for (const auto& [id, lp] : pos) alts.push_back({id, lp});
      j["top_logprobs"].push_back(alts);
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < r.ids.size(); ++i) line += (i ? "," : "") + std::to_string(r.ids[i]);
    if (tokenizer != nullptr && !f.IsSet("prompt-ids")) {
      std::printf("%s\n", text.c_str());
      std::fprintf(stderr, "ids: %s\n", line.c_str());
    } else {
      std::printf("%s\n", line.c_str());
    }
    std::fprintf(stderr, "finish_reason: %s\n", r.finish_reason.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  FlagSet f("duet generate",
            "Generates tokens from a prompt on one engine, in this process (the reference the\n"
            "serving path is tested against). Prints the generated text (the ids, comma-separated,\n"
            "for --prompt-ids), or with --json one object {\"ids\", \"text\", \"finish_reason\",\n"
            "\"top_logprobs\"}. Exactly one of --prompt-ids, --prompt, --chat.");
  f.String("model", "", "Hugging Face model directory (default: the embedded tiny model)");
  f.String("prompt-ids", "", "prompt token ids, comma-separated, used as given (nothing added)");
  f.String("prompt", "", "prompt text; BOS is prepended when tokenizer_config.json's add_bos_token says so");
  f.String("chat", "",
           "a conversation as a JSON array of {\"role\", \"content\"}, rendered with the model's chat "
           "template (Llama-3 or ChatML) and an assistant turn to complete");
  f.Int("max-tokens", 16, "tokens to generate at most");
  f.Double("temperature", 1.0, "sampling temperature; 0 is greedy");
  f.Double("top-p", 1.0, "nucleus sampling mass in (0, 1]");
  f.Int("top-k", 0, "keep the k most likely tokens; 0 keeps all");
  f.Double("min-p", 0.0, "drop tokens below min-p times the most likely one's probability");
  f.Double("presence-penalty", 0.0, "subtract this from the logit of every token generated so far, [-2, 2]");
  f.Double("frequency-penalty", 0.0, "subtract this times its count so far from a token's logit, [-2, 2]");
  f.Int("seed", 0, "sampling seed (default: random)");
  f.Bool("ignore-eos", "keep generating past the model's EOS ids");
  f.Int("logprobs", 0, "report the top-K log-probabilities per generated position");
  f.Bool("json", "print one JSON object");
  f.Int("threads", 0, "CPU threads; 0 uses every core this process may run on");
  AddLoadFlags(f);
  f.Int("block-size", 16, "KV cache block size in tokens");
  f.Int("prefill-chunk", 0, "prefill the prompt in chunks of this many tokens; 0: one step");
  return RunWithFlags(f, argc, argv, Generate);
}

}  // namespace duet::tools

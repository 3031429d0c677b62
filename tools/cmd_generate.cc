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
#include "engine/generator.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/commands.h"
#include "tools/model_maker.h"

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

absl::Status Generate(const FlagSet& f) {
  std::string dir = f.GetString("model");
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, EnsureCachedModel("tiny", "llama"));
  }
  if (!f.IsSet("prompt-ids")) return absl::InvalidArgumentError("--prompt-ids is required");
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIds(f.GetString("prompt-ids")));

  engine::GenerateOptions opt;
  opt.max_tokens = f.GetInt("max-tokens");
  opt.ignore_eos = f.GetBool("ignore-eos");
  opt.prefill_chunk = f.GetInt("prefill-chunk");
  opt.sampling.temperature = static_cast<float>(f.GetDouble("temperature"));
  opt.sampling.top_p = static_cast<float>(f.GetDouble("top-p"));
  opt.sampling.top_k = static_cast<int32_t>(f.GetInt("top-k"));
  opt.sampling.min_p = static_cast<float>(f.GetDouble("min-p"));
  opt.sampling.logprobs = static_cast<int32_t>(f.GetInt("logprobs"));
  opt.sampling.seed = f.IsSet("seed") ? static_cast<uint64_t>(f.GetInt("seed")) : std::random_device{}();
  RETURN_IF_ERROR(opt.sampling.Validate());
  if (opt.max_tokens < 0) return absl::InvalidArgumentError("--max-tokens must be >= 0");

  auto backend = kernels::NewCpuBackend(static_cast<int>(f.GetInt("threads")));
  ASSIGN_OR_RETURN(auto model, engine::Model::Load(dir, backend.get()));
  const int64_t bs = f.GetInt("block-size");
  if (bs <= 0) return absl::InvalidArgumentError("--block-size must be > 0");
  const int64_t tokens = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + opt.max_tokens + 1,
                                           model->config().max_position_embeddings + 1);
  engine::BlockPool pool(model->KvLayoutFor(bs), (tokens + bs - 1) / bs);
  ASSIGN_OR_RETURN(engine::GenerateResult r, engine::Generate(*model, pool, prompt, opt));

  if (f.GetBool("json")) {
    nlohmann::json j;
    j["ids"] = r.ids;
    j["text"] = "";
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
    std::printf("%s\n", line.c_str());
    std::fprintf(stderr, "finish_reason: %s\n", r.finish_reason.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  FlagSet f("duet generate",
            "Generates tokens from a prompt on one engine, in this process (the reference the\n"
            "serving path is tested against). Prints the generated ids, comma-separated, or with\n"
            "--json one object {\"ids\", \"text\", \"finish_reason\", \"top_logprobs\"}.");
  f.String("model", "", "Hugging Face model directory (default: the embedded tiny model)");
  f.String("prompt-ids", "", "prompt token ids, comma-separated, used as given (nothing added)");
  f.Int("max-tokens", 16, "tokens to generate at most");
  f.Double("temperature", 1.0, "sampling temperature; 0 is greedy");
  f.Double("top-p", 1.0, "nucleus sampling mass in (0, 1]");
  f.Int("top-k", 0, "keep the k most likely tokens; 0 keeps all");
  f.Double("min-p", 0.0, "drop tokens below min-p times the most likely one's probability");
  f.Int("seed", 0, "sampling seed (default: random)");
  f.Bool("ignore-eos", "keep generating past the model's EOS ids");
  f.Int("logprobs", 0, "report the top-K log-probabilities per generated position");
  f.Bool("json", "print one JSON object");
  f.Int("threads", 0, "CPU threads; 0 uses every core this process may run on");
  f.Int("block-size", 16, "KV cache block size in tokens");
  f.Int("prefill-chunk", 0, "prefill the prompt in chunks of this many tokens; 0: one step");
  absl::Status s = f.Parse(argc, argv);
  if (f.help_requested()) {
    std::fputs(f.Usage().c_str(), stdout);
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "duet generate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  s = Generate(f);
  if (!s.ok()) {
    std::fprintf(stderr, "duet generate: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace duet::tools

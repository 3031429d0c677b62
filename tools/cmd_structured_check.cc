#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "grammar/check.h"
#include "text/tokenizer.h"
#include "tools/commands.h"

namespace duet::tools {
namespace {

absl::Status StructuredCheck(const FlagSet& f) {
  if (f.GetString("tokenizer").empty() || f.GetString("data").empty()) {
    return absl::InvalidArgumentError("--tokenizer and --data are required");
  }
  const int64_t threads = f.GetInt("threads");
  if (threads < 1 || threads > 256) return absl::InvalidArgumentError("--threads must be 1..256");
  ASSIGN_OR_RETURN(auto tok, text::Tokenizer::Load(f.GetString("tokenizer")));
  ASSIGN_OR_RETURN(auto rows, grammar::ReadJsonLines(f.GetString("data")));
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto vocab, grammar::Vocabulary::FromTokenizer(*tok, {}));
  const double trie_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "structured-check: %zu schemas, vocabulary of %d tokens (tries built in %.0f ms)\n",
               rows.size(), vocab->size(), trie_ms);
  const auto results = grammar::CheckRows(rows, *tok, vocab, static_cast<int>(threads), [&](size_t done) {
    std::fprintf(stderr, "structured-check: %zu/%zu schemas\n", done, rows.size());
  });
  if (f.GetBool("json")) {
    for (const auto& r : results) std::cout << r.ToJson().dump() << "\n";
  } else {
    std::cout << grammar::FormatSummary(grammar::Summarize(results));
  }
  return absl::OkStatus();
}

}  // namespace

int RunStructuredCheck(int argc, char** argv) {
  FlagSet f("duet structured-check",
            "Compiles each JSON schema of a JSONSchemaBench-style file (one JSON object per line:\n"
            "id, schema, tests: [{valid, data}]) and feeds each instance, as compact JSON, token by\n"
            "token through the serving matcher and masks. Prints a summary, or with --json one line\n"
            "per schema: {id, compiled, error, tests: [{valid, accepted, order}], compile_us, mask_us}.");
  f.String("tokenizer", "", "a model directory or tokenizer.json whose vocabulary the masks cover (required)");
  f.String("data", "", "the schemas: a .jsonl or .jsonl.gz file (required)");
  f.Bool("json", "one JSON line per schema instead of the summary");
  f.Int("threads", 1, "schemas checked in parallel (times are per thread)");
  return RunWithFlags(f, argc, argv, [](const FlagSet& flags) { return StructuredCheck(flags); });
}

}  // namespace duet::tools

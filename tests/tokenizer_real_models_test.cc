// duet's tokenizer on real models' tokenizer.json files (byte-level Qwen3
// and Llama-3.1, SentencePiece-style Llama-2 and Gemma-3, from the pinned
// @lenml packages) against the packages' own
// JavaScript tokenizer (@lenml/tokenizers, a port of transformers.js), on
// the >= 1 MiB tokenizer corpus (multilingual text, code, whitespace runs,
// emoji) plus records with the models' special tokens: every record gets the
// reference's ids (without BOS/EOS) and decodes to the reference's text
// (the record itself, or with an NFC normalizer, as Qwen3 has, its NFC
// form). Needs node and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/testing/tokenizer_corpus.h"
#include "engine/testing/tokenizer_node.h"
#include "text/tokenizer.h"
#include "tests/tokenizer_parity.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "engine/testing/npm/encode_lenml.js";

fs::path TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Checks the package's tokenizer.json, or with `edit` a variant of it that
// both sides load.
void CheckModel(const std::string& package, const std::vector<std::string>& specials,
                const std::function<void(nlohmann::json&)>& edit = nullptr) {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  INFO(modules.status());
  REQUIRE(modules.ok());
  fs::path file = fs::path(*modules) / "@lenml" / absl::StrCat("tokenizer-", package) / "models" / "tokenizer.json";
  std::vector<std::string> variant_args;
  if (edit) {
    std::ifstream in(file);
    nlohmann::json doc = nlohmann::json::parse(in);
    edit(doc);
    file = TempDir() / (package + "_variant.json");
    std::ofstream(file) << doc.dump();
    variant_args = {"--json", file.string()};
  }
  auto tok = text::Tokenizer::Load(file.string());
  INFO(file.string() << ": " << tok.status());
  REQUIRE(tok.ok());
  std::vector<std::string> records = TokenizerCorpus();
  records.insert(records.end(), specials.begin(), specials.end());
  const std::string corpus = (TempDir() / (package + "_corpus.jsonl")).string();
  REQUIRE(WriteCorpusJsonLines(records, corpus).ok());
  auto script_args = [&](std::vector<std::string> args) {
    args.insert(args.end(), variant_args.begin(), variant_args.end());
    return args;
  };
  absl::StatusOr<std::string> out = RunNodeScript(kScript, script_args({package, corpus}), *modules);
  INFO(out.status());
  REQUIRE(out.ok());
  auto ids = ParseIdLines(*out);
  INFO(ids.status());
  REQUIRE(ids.ok());
  RequireAllPassed(CompareIds(**tok, records, *ids), /*min_records=*/1000);
  absl::StatusOr<std::string> texts = RunNodeScript(kScript, script_args({package, corpus, "--decode"}), *modules);
  INFO(texts.status());
  REQUIRE(texts.ok());
  std::istringstream lines(*texts);
  size_t i = 0, wrong = 0, normalized = 0;
  for (std::string line; std::getline(lines, line); ++i) {
    REQUIRE(i < records.size());
    const std::string want = nlohmann::json::parse(line).get<std::string>();
    normalized += want != records[i];
    auto got = (*tok)->Decode((*ids)[i]);
    REQUIRE(got.ok());
    if (*got != want && ++wrong <= 3) WARN("record " << i << ": " << Quote(*got) << " != " << Quote(want));
  }
  CHECK(i == records.size());
  CHECK(wrong == 0);
  WARN(package << ": " << records.size() << " records, " << normalized << " decode to a normalized form");
}

TEST_CASE("Qwen3's tokenizer.json encodes every corpus record as the reference does", "[tokenizer][parity]") {
  CheckModel("qwen3", {"<|im_start|>user\nHi 你好<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                       "<tool_call>\n{\"name\": \"f\"}\n</tool_call><|endoftext|> <|not_a_token|>"});
}

TEST_CASE("Llama-2's tokenizer.json (Prepend and Replace, byte fallback) encodes every corpus record as the reference does",
          "[tokenizer][parity]") {
  CheckModel("llama2", {"<s>[INST] Hi there [/INST] Hello</s>", "<s>Hi</s> there <unk>\u00a0\u2581x \U0001F600"});
}

TEST_CASE("Llama-2 with a Metaspace pre-tokenizer (legacy: false) encodes as the reference does",
          "[tokenizer][parity]") {
  // What Hugging Face's converter writes for a Llama tokenizer with legacy
  // false: no normalizer, U+2581 prepended to the text's start only (the
  // decoder stays the same).
  CheckModel("llama2", {"<s>[INST] Hi there [/INST] Hello</s>", "Hi <s> there\u2581x"}, [](nlohmann::json& doc) {
    doc["normalizer"] = nullptr;
    doc["pre_tokenizer"] = {{"type", "Metaspace"},    {"replacement", "\u2581"},
                            {"add_prefix_space", true}, {"prepend_scheme", "first"},
                            {"split", false}};
  });
}

TEST_CASE("Gemma-3's tokenizer.json (Replace, Split merged with previous) encodes every corpus record as the reference does",
          "[tokenizer][parity]") {
  CheckModel("gemma3", {"<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
                        "<start_of_image> a  b\t\u2581c<unused3>\U0001F600"});
}

TEST_CASE("Llama-3.1's tokenizer.json encodes every corpus record as the reference does", "[tokenizer][parity]") {
  CheckModel("llama3_1", {"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat's 2+2?<|eot_id|>",
                          "<|python_tag|>print(\"hi\")<|eom_id|> <|not_a_token|>"});
}

}  // namespace
}  // namespace duet::testing

#include "text/bpe_trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "text/chat_templates.h"
#include "nlohmann/json.hpp"

namespace duet::text {
namespace {

using Json = nlohmann::json;
using Merge = std::pair<std::string, std::string>;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  REQUIRE(tmp != nullptr);
  return (std::filesystem::path(tmp) / name).string();
}

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

BpeVocab Train(std::string_view corpus, int vocab_size,
               std::vector<std::string> specials = {}) {
  auto vocab = TrainByteLevelBpe(corpus, {vocab_size, std::move(specials)});
  REQUIRE(vocab.ok());
  return *std::move(vocab);
}

TEST_CASE("byte-level table matches GPT-2's") {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) seen.insert(ByteToUnicode(b));
  CHECK(seen.size() == 256);
  CHECK(ByteToUnicode(' ') == U'\u0120');   // Ġ
  CHECK(ByteToUnicode('\n') == U'\u010A');  // Ċ
  CHECK(ByteToUnicode('\t') == U'\u0109');  // ĉ
  CHECK(ByteToUnicode(0) == U'\u0100');     // Ā
  CHECK(ByteToUnicode(0x7F) == U'\u0121');  // DEL -> ġ
  CHECK(ByteToUnicode(0xAD) == U'\u0143');  // soft hyphen -> Ń, the last one
  CHECK(ByteToUnicode('a') == U'a');
  CHECK(ByteToUnicode('!') == U'!');
  CHECK(ByteToUnicode(0xE9) == U'\u00E9');  // é's byte maps to itself

  CHECK(ByteLevelEncode(" a\n") == "\xC4\xA0" "a" "\xC4\x8A");  // "Ġa" "Ċ"
  CHECK(ByteLevelEncode("é") == "\xC3\x83\xC2\xA9");            // "Ã©"

  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto round_trip = ByteLevelDecode(ByteLevelEncode(all));
  REQUIRE(round_trip.ok());
  CHECK(*round_trip == all);
  CHECK(!ByteLevelDecode("\xE2\x82\xAC").ok());  // '€' is not in the table.
  CHECK(!ByteLevelDecode("\xC4").ok());          // Truncated UTF-8.
}

TEST_CASE("pre-tokenizer splits like GPT-2's regex") {
  using V = std::vector<std::string_view>;
  CHECK(SplitGpt2Words("Hello world") == V{"Hello", " world"});
  CHECK(SplitGpt2Words("it's we'll") == V{"it", "'s", " we", "'ll"});
  CHECK(SplitGpt2Words("x  y") == V{"x", " ", " y"});
  CHECK(SplitGpt2Words("a\n\nb") == V{"a", "\n", "\n", "b"});
  CHECK(SplitGpt2Words("a \n b") == V{"a", " \n", " b"});
  CHECK(SplitGpt2Words("end  ") == V{"end", "  "});
  CHECK(SplitGpt2Words("x=42;") == V{"x", "=", "42", ";"});
  CHECK(SplitGpt2Words(" 2048 tokens!!") ==
        V{" 2048", " tokens", "!!"});
  CHECK(SplitGpt2Words("f(a, b)") == V{"f", "(", "a", ",", " b", ")"});
  CHECK(SplitGpt2Words("café au") == V{"café", " au"});
  CHECK(SplitGpt2Words("\tx") == V{"\t", "x"});
  // Pieces always cover the text.
  std::string joined;
  for (std::string_view w : SplitGpt2Words(TrainingCorpus())) joined += w;
  CHECK(joined == TrainingCorpus());
}

TEST_CASE("hand-computed merges on a toy corpus") {
  // Words: "aaab" x1, " aaab" x2. Pair counts: aa 6, ab 3, " a" 2 -> (a,a).
  // Then (aa,a) 3 and (a,b) 3 tie; "a" < "aa" so (a,b) wins. Then (aa,ab) 3,
  // then (Ġ,aaab) 2, then no pair occurs twice.
  BpeVocab vocab = Train("aaab aaab aaab", 1000);
  CHECK(vocab.merges == std::vector<Merge>{{"a", "a"},
                                           {"a", "b"},
                                           {"aa", "ab"},
                                           {"\xC4\xA0", "aaab"}});
  REQUIRE(vocab.tokens.size() == 260);
  CHECK(vocab.tokens[256] == "aa");
  CHECK(vocab.tokens[257] == "ab");
  CHECK(vocab.tokens[258] == "aaab");
  CHECK(vocab.tokens[259] == "\xC4\xA0" "aaab");
  CHECK(vocab.tokens['a'] == "a");
  CHECK(vocab.tokens[' '] == "\xC4\xA0");

  // Merges never cross word boundaries: "b a" would need the pair (b, Ġ).
  BpeVocab crossing = Train("ab ab ab ab", 1000);
  for (const auto& [l, r] : crossing.merges) CHECK(r.rfind("\xC4\xA0", 0) != 0);
}

TEST_CASE("vocab size is respected exactly and merges are consistent") {
  const std::vector<std::string> specials =
      SpecialTokensFor(ChatFormat::kLlama3);
  BpeVocab full = Train(TrainingCorpus(), 1 << 20, specials);
  const int max_size =
      static_cast<int>(full.tokens.size() + full.special_tokens.size());
  CHECK(max_size > 1500);  // The corpus supports a useful vocab.
  CHECK(max_size < (1 << 20));
  for (int size : {261, 300, 1000, max_size - 1, max_size}) {
    BpeVocab vocab = Train(TrainingCorpus(), size, specials);
    CHECK(static_cast<int>(vocab.tokens.size() + vocab.special_tokens.size()) ==
          size);
    CHECK(vocab.special_tokens == specials);
    // A smaller vocab learns a prefix of the larger one's merges.
    REQUIRE(vocab.merges.size() <= full.merges.size());
    CHECK(std::equal(vocab.merges.begin(), vocab.merges.end(),
                     full.merges.begin()));
  }
  std::map<std::string, int> id;
  for (size_t i = 0; i < full.tokens.size(); ++i) {
    CHECK(id.emplace(full.tokens[i], static_cast<int>(i)).second);
  }
  for (const auto& [l, r] : full.merges) {
    REQUIRE(id.count(l) == 1);
    REQUIRE(id.count(r) == 1);
    REQUIRE(id.count(l + r) == 1);
    // Parts exist before the result.
    CHECK(id[l] < id[l + r]);
    CHECK(id[r] < id[l + r]);
  }
  CHECK(id.count("\xC4\xA0" "the") == 1);  // " the" is surely learned.
}

TEST_CASE("training is deterministic and fast") {
  const auto start = std::chrono::steady_clock::now();
  BpeVocab a = Train(TrainingCorpus(), 4096, SpecialTokensFor(ChatFormat::kChatML));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  BpeVocab b = Train(TrainingCorpus(), 4096, SpecialTokensFor(ChatFormat::kChatML));
  CHECK(a.merges == b.merges);
  CHECK(a.tokens == b.tokens);
  CHECK(a.merges.size() > 1000);
  // Generous bound (sanitizers, loaded CI); a recount-all trainer takes longer.
  CHECK(elapsed < std::chrono::seconds(5));
}

TEST_CASE("invalid options are rejected") {
  CHECK(TrainByteLevelBpe("abc", {255, {}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TrainByteLevelBpe("abc", {257, {"<a>", "<b>"}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TrainByteLevelBpe("abc", {300, {"<a>", "<a>"}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TrainByteLevelBpe("abc", {300, {""}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TrainByteLevelBpe("abc", {300, {"a"}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto exact = TrainByteLevelBpe("abc abc", {256, {}});
  REQUIRE(exact.ok());
  CHECK(exact->merges.empty());
}

TEST_CASE("tokenizer.json has the Hugging Face structure") {
  const std::vector<std::string> specials =
      SpecialTokensFor(ChatFormat::kLlama3);
  BpeVocab vocab = Train(TrainingCorpus(), 1024, specials);
  const std::string dir = TestDir("llama3");
  REQUIRE(WriteTokenizerFiles(dir, vocab, ChatFormat::kLlama3).ok());

  Json tok = ReadJson(dir + "/tokenizer.json");
  CHECK(tok["version"] == "1.0");
  CHECK(tok["normalizer"].is_null());
  CHECK(tok["post_processor"].is_null());
  const Json& pre = tok["pre_tokenizer"];
  CHECK(pre["type"] == "Sequence");
  REQUIRE(pre["pretokenizers"].size() == 2);
  CHECK(pre["pretokenizers"][0]["type"] == "Split");
  CHECK(pre["pretokenizers"][0]["pattern"]["Regex"] ==
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
        "\\s+(?!\\S)|\\s+");
  CHECK(pre["pretokenizers"][0]["behavior"] == "Isolated");
  CHECK(pre["pretokenizers"][1]["type"] == "ByteLevel");
  CHECK(pre["pretokenizers"][1]["use_regex"] == false);
  CHECK(tok["decoder"]["type"] == "ByteLevel");

  const Json& model = tok["model"];
  CHECK(model["type"] == "BPE");
  CHECK(model["byte_fallback"] == false);
  CHECK(model["dropout"].is_null());
  const Json& vmap = model["vocab"];
  REQUIRE(vmap.size() == vocab.tokens.size());
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    REQUIRE(vmap.contains(vocab.tokens[i]));
    CHECK(vmap[vocab.tokens[i]] == i);
  }
  CHECK(vmap["\xC4\xA0"] == 32);
  CHECK(vmap["a"] == 97);
  REQUIRE(model["merges"].size() == vocab.merges.size());
  CHECK(model["merges"][0] ==
        Json::array({vocab.merges[0].first, vocab.merges[0].second}));

  const Json& added = tok["added_tokens"];
  REQUIRE(added.size() == specials.size());
  for (size_t i = 0; i < specials.size(); ++i) {
    CHECK(added[i]["id"] == 1024 - specials.size() + i);
    CHECK(added[i]["content"] == specials[i]);
    CHECK(added[i]["special"] == true);
    CHECK(added[i]["normalized"] == false);
    CHECK(added[i]["lstrip"] == false);
    CHECK(!vmap.contains(specials[i]));
  }

  Json config = ReadJson(dir + "/tokenizer_config.json");
  CHECK(config["chat_template"] == kLlama3ChatTemplate);
  CHECK(config["bos_token"] == "<|begin_of_text|>");
  CHECK(config["eos_token"] == "<|eot_id|>");
  CHECK(config["add_bos_token"] == true);
  CHECK(config["add_eos_token"] == false);
  CHECK(config["model_max_length"].is_number_integer());
  CHECK(config["added_tokens_decoder"]["1023"]["content"] == "<|eot_id|>");
  CHECK(config["added_tokens_decoder"].size() == specials.size());
  CHECK(ReadJson(dir + "/special_tokens_map.json")["eos_token"] == "<|eot_id|>");
}

TEST_CASE("ChatML tokenizer_config has Qwen2's template and no BOS") {
  BpeVocab vocab =
      Train(TrainingCorpus(), 512, SpecialTokensFor(ChatFormat::kChatML));
  const std::string dir = TestDir("chatml");
  REQUIRE(WriteTokenizerFiles(dir, vocab, ChatFormat::kChatML).ok());
  Json config = ReadJson(dir + "/tokenizer_config.json");
  CHECK(config["chat_template"] == kChatMLChatTemplate);
  CHECK(config["bos_token"].is_null());
  CHECK(config["add_bos_token"] == false);
  CHECK(config["eos_token"] == "<|im_end|>");
  CHECK(config["pad_token"] == "<|endoftext|>");
  CHECK(config["added_tokens_decoder"]["509"]["content"] == "<|endoftext|>");
  CHECK(config["added_tokens_decoder"]["511"]["content"] == "<|im_end|>");
  CHECK(std::string(kChatMLChatTemplate).find(
            "'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n'") !=
        std::string::npos);
}

TEST_CASE("write errors name the file; missing specials are rejected") {
  BpeVocab vocab =
      Train(TrainingCorpus(), 512, SpecialTokensFor(ChatFormat::kChatML));
  // A file where the directory should be.
  const std::string blocker = TestDir("blocker");
  std::ofstream(blocker) << "x";
  absl::Status s = WriteTokenizerFiles(blocker, vocab, ChatFormat::kChatML);
  CHECK(!s.ok());
  CHECK(s.message().find("blocker") != std::string_view::npos);

  // A directory where tokenizer_config.json should be.
  const std::string dir = TestDir("config_blocked");
  std::filesystem::create_directories(dir + "/tokenizer_config.json");
  s = WriteTokenizerFiles(dir, vocab, ChatFormat::kChatML);
  CHECK(!s.ok());
  CHECK(s.message().find("tokenizer_config.json") != std::string_view::npos);

  s = WriteTokenizerFiles(TestDir("wrong_format"), vocab, ChatFormat::kLlama3);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::text

#include "text/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "text/bpe_byte_level.h"
#include "text/bpe_model.h"
#include "text/bpe_trainer.h"
#include "text/chat_templates.h"
#include "text/tokenizer_regex.h"
#include "nlohmann/json.hpp"

namespace duet::text {
namespace {

using Json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

// The Llama-3 and Qwen2 pre-tokenizer patterns, as their tokenizer.json
// files spell them.
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  REQUIRE(tmp != nullptr);
  const std::filesystem::path dir = std::filesystem::path(tmp) / name;
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  REQUIRE(out.good());
  out << text;
}

std::string B(int byte) { return ByteLevelEncode(std::string(1, static_cast<char>(byte))); }

// A toy byte-level vocabulary: id b is byte b (in byte-level form), then
// the results of these merges, in this rank order.
const std::vector<std::pair<std::string, std::string>>& ToyMerges() {
  static const auto* merges = new std::vector<std::pair<std::string, std::string>>{
      {"Ġ", "t"},      // 256 Ġt
      {"h", "e"},      // 257 he
      {"Ġt", "he"},    // 258 Ġthe
      {"l", "l"},      // 259 ll
      {"he", "ll"},    // 260 hell
      {"hell", "o"},   // 261 hello
      {"e", "l"},      // 262 el: ranked below "h e", so "hell" never uses it
      {"Ġ", "w"},      // 263 Ġw
      {"o", "r"},      // 264 or
      {"Ġw", "or"},    // 265 Ġwor
      {"l", "d"},      // 266 ld
      {"Ġwor", "ld"},  // 267 Ġworld
      {"3", "4"},      // 268 34: shows where a pre-tokenizer cuts digit runs
  };
  return *merges;
}
constexpr int kEot = 300;    // "<|eot|>", special
constexpr int kAngle = 301;  // "<|e", not special: loses to the longer match
constexpr int kTool = 302;   // "[tool]", not special

Json ToyVocab() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[B(b)] = b;
  int id = 256;
  for (const auto& [l, r] : ToyMerges()) vocab[l + r] = id++;
  return vocab;
}

Json AddedToken(int id, const std::string& content, bool special) {
  return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", special}};
}

Json ByteLevelPre(bool add_prefix_space, bool use_regex) {
  return Json{{"type", "ByteLevel"},
              {"add_prefix_space", add_prefix_space},
              {"trim_offsets", true},
              {"use_regex", use_regex}};
}

Json SplitPre(const std::string& regex, const std::string& behavior = "Isolated") {
  return Json{{"type", "Split"},
              {"pattern", {{"Regex", regex}}},
              {"behavior", behavior},
              {"invert", false}};
}

Json Sequence(Json a, Json b) {
  return Json{{"type", "Sequence"}, {"pretokenizers", Json::array({a, b})}};
}

// tokenizer.json for the toy vocabulary with GPT-2's pre-tokenizer.
Json ToyJson(bool pair_merges = false) {
  Json merges = Json::array();
  for (const auto& [l, r] : ToyMerges()) {
    merges.push_back(pair_merges ? Json::array({l, r}) : Json(l + " " + r));
  }
  Json doc;
  doc["version"] = "1.0";
  doc["added_tokens"] =
      Json::array({AddedToken(kEot, "<|eot|>", true), AddedToken(kAngle, "<|e", false),
                   AddedToken(kTool, "[tool]", false)});
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = ByteLevelPre(false, true);
  doc["post_processor"] = nullptr;
  doc["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  doc["model"] = {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
                  {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", ToyVocab()},
                  {"merges", merges}};
  return doc;
}

std::unique_ptr<Tokenizer> FromJson(const Json& doc) {
  auto tok = Tokenizer::FromTokenizerJson(doc.dump(), "toy/tokenizer.json");
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return *std::move(tok);
}

Ids Encode(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text);
  INFO(ids.status().ToString());
  REQUIRE(ids.ok());
  return *ids;
}

Ids Bytes(std::string_view text) {
  Ids ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string DecodeOk(const Tokenizer& tok, const Ids& ids, bool skip_special = false) {
  auto text = tok.Decode(ids, skip_special);
  INFO(text.status().ToString());
  REQUIRE(text.ok());
  return *text;
}

std::vector<std::string> Pieces(const std::string& pattern, std::string_view text) {
  auto re = SplitRegex::Compile(pattern);
  INFO(re.status().ToString());
  REQUIRE(re.ok());
  std::vector<std::string> pieces;
  REQUIRE(SplitPieces(**re, text, SplitBehavior::kIsolated, false, [&](std::string_view p) {
            pieces.emplace_back(p);
          }).ok());
  return pieces;
}

using Strings = std::vector<std::string>;

// Strings that stress byte-level round trips: accents, CJK, Cyrillic,
// emoji with ZWJ and skin tones, flags, combining marks, control bytes.
const Strings& Multilingual() {
  static const auto* strings = new Strings{
      "",
      "hello world",
      "  leading and trailing  \n\n",
      "héllo wörld, ça va? naïve façade",
      "日本語のテキストと中文文本",
      "Привет, мир! Ελληνικά",
      "family 👨‍👩‍👧‍👦, skin 👍🏽, flags 🇯🇵🇫🇷, keycap 1️⃣",
      "e\u0301 (decomposed) vs \u00e9",
      "tabs\tand\r\nwindows lines\x01\x7f",
      "I'M IT'S 12345 x=y 1.5e-3",
  };
  return *strings;
}

// ---------------------------------------------------------------------------

TEST_CASE("toy tokenizer gives the ids its merges predict") {
  auto tok = FromJson(ToyJson());
  CHECK(Encode(*tok, "hello world") == Ids{261, 267});
  CHECK(Encode(*tok, " the") == Ids{258});
  CHECK(Encode(*tok, "the") == Ids{'t', 257});
  // "shell": "h e" (rank 1) beats "e l" (rank 6), then ll, hell.
  CHECK(Encode(*tok, "shell") == Ids{'s', 260});
  CHECK(Encode(*tok, "hello the world") == Ids{261, 258, 267});
  CHECK(Encode(*tok, "") == Ids{});
  CHECK(Encode(*tok, "12345") == Ids{'1', '2', 268, '5'});  // GPT-2 keeps digit runs whole.
  CHECK(tok->vocab_size() == 303);
  CHECK(tok->TokenToId("Ġthe") == 258);
  CHECK(tok->TokenToId("<|eot|>") == kEot);
  CHECK(tok->TokenToId(" the") == -1);
  CHECK(tok->TokenToId("nope") == -1);
}

TEST_CASE("merge rank order decides the result") {
  // Moving "e l" to the front makes "hell" merge h + el + l, and nothing
  // combines those.
  Json doc = ToyJson();
  Json& merges = doc["model"]["merges"];
  Json reordered = Json::array({"e l"});
  for (const auto& m : merges) {
    if (m != "e l") reordered.push_back(m);
  }
  merges = reordered;
  auto tok = FromJson(doc);
  CHECK(Encode(*tok, "shell") == Ids{'s', 'h', 262, 'l'});
  CHECK(Encode(*tok, " the") == Ids{258});
}

TEST_CASE("both merge formats load the same model") {
  auto strings = FromJson(ToyJson(/*pair_merges=*/false));
  auto pairs = FromJson(ToyJson(/*pair_merges=*/true));
  for (const std::string& s : Multilingual()) {
    CHECK(Encode(*strings, s) == Encode(*pairs, s));
  }
  CHECK(Encode(*pairs, "hello world") == Ids{261, 267});
}

TEST_CASE("ignore_merges emits a whole-word token without merging") {
  // "Ġhello" is in the vocab but no merge builds it: merging gives
  // Ġ + hello, ignore_merges takes the vocab entry as it is.
  Json doc = ToyJson();
  doc["model"]["vocab"]["Ġhello"] = 299;
  auto plain = FromJson(doc);
  CHECK(Encode(*plain, " hello") == Ids{' ', 261});
  doc["model"]["ignore_merges"] = true;
  auto ignoring = FromJson(doc);
  CHECK(Encode(*ignoring, " hello") == Ids{299});
  CHECK(Encode(*ignoring, "shell") == Ids{'s', 260});
}

TEST_CASE("added tokens are found in the text, longest first") {
  auto tok = FromJson(ToyJson());
  CHECK(Encode(*tok, "hello<|eot|> the") == Ids{261, kEot, 258});
  CHECK(Encode(*tok, "<|eot|><|eot|>") == Ids{kEot, kEot});
  // "<|e" is a prefix of "<|eot|>": the longer token wins where both match.
  CHECK(Encode(*tok, "<|eo") == Ids{kAngle, 'o'});
  CHECK(Encode(*tok, "a[tool]b") == Ids{'a', kTool, 'b'});
  // The text between added tokens is pre-tokenized on its own.
  CHECK(Encode(*tok, "the[tool] the") == Ids{'t', 257, kTool, 258});

  CHECK(DecodeOk(*tok, {261, kEot, 258}) == "hello<|eot|> the");
  CHECK(DecodeOk(*tok, {261, kEot, 258}, /*skip_special=*/true) == "hello the");
  // Non-special added tokens survive skip_special.
  CHECK(DecodeOk(*tok, {'a', kTool, 'b'}, /*skip_special=*/true) == "a[tool]b");

  const auto& added = tok->added_tokens();
  REQUIRE(added.size() == 3);
  CHECK(added[0].id == kEot);
  CHECK(added[0].content == "<|eot|>");
  CHECK(added[0].special);
  CHECK_FALSE(added[2].special);
}

TEST_CASE("added-token lstrip, rstrip and single_word follow Hugging Face") {
  Json doc = ToyJson();
  Json mask = AddedToken(kTool, "<mask>", false);

  mask["lstrip"] = true;
  doc["added_tokens"][2] = mask;
  auto lstrip = FromJson(doc);
  CHECK(Encode(*lstrip, "a <mask> b") == Ids{'a', kTool, ' ', 'b'});
  CHECK(Encode(*lstrip, "a\u2003\t<mask>") == Ids{'a', kTool});  // Unicode spaces too.

  mask["lstrip"] = false;
  mask["rstrip"] = true;
  doc["added_tokens"][2] = mask;
  auto rstrip = FromJson(doc);
  CHECK(Encode(*rstrip, "a <mask> b") == Ids{'a', ' ', kTool, 'b'});

  mask["rstrip"] = false;
  mask["single_word"] = true;
  doc["added_tokens"][2] = mask;
  auto single = FromJson(doc);
  CHECK(Encode(*single, "a <mask> b") == Ids{'a', ' ', kTool, ' ', 'b'});
  CHECK(Encode(*single, "<mask>") == Ids{kTool});
  // Glued to a word (ASCII or not, or a combining mark): not a match.
  for (const char* text : {"a<mask>", "<mask>b", "é<mask>", "\u0301<mask>"}) {
    INFO(text);
    const Ids ids = Encode(*single, text);
    CHECK(std::find(ids.begin(), ids.end(), kTool) == ids.end());
  }
  CHECK(Encode(*single, "(<mask>)") == Ids{'(', kTool, ')'});
}

TEST_CASE("NFC normalizer composes before merging") {
  Json doc = ToyJson();
  auto plain = FromJson(doc);
  CHECK(Encode(*plain, "e\u0301") == Ids{'e', 0xCC, 0x81});
  CHECK(Encode(*plain, "\u00e9") == Ids{0xC3, 0xA9});

  doc["normalizer"] = {{"type", "NFC"}};
  auto nfc = FromJson(doc);
  CHECK(Encode(*nfc, "e\u0301") == Ids{0xC3, 0xA9});
  CHECK(Encode(*nfc, "caf\u00e9 cafe\u0301") == Encode(*nfc, "caf\u00e9 caf\u00e9"));
  // Hangul jamo compose into one syllable.
  CHECK(Encode(*nfc, "\u1100\u1161") == Encode(*nfc, "\uAC00"));

  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array({Json{{"type", "NFC"}}})}};
  auto sequence = FromJson(doc);
  CHECK(Encode(*sequence, "e\u0301") == Ids{0xC3, 0xA9});

  // A normalized added token matches its NFC form in the normalized text,
  // however the input spelled it; a raw one matches only its own bytes.
  doc["normalizer"] = {{"type", "NFC"}};
  Json cafe = AddedToken(kTool, "cafe\u0301", false);
  cafe["normalized"] = true;
  doc["added_tokens"][2] = cafe;
  auto normalized = FromJson(doc);
  CHECK(Encode(*normalized, "caf\u00e9") == Ids{kTool});
  CHECK(Encode(*normalized, "cafe\u0301!") == Ids{kTool, '!'});
  cafe["normalized"] = false;
  doc["added_tokens"][2] = cafe;
  auto raw = FromJson(doc);
  CHECK(Encode(*raw, "cafe\u0301") == Ids{kTool});
  CHECK(Encode(*raw, "caf\u00e9") == Ids{'c', 'a', 'f', 0xC3, 0xA9});
}

TEST_CASE("ByteLevel add_prefix_space prepends a space to each piece") {
  Json doc = ToyJson();
  doc["pre_tokenizer"] = ByteLevelPre(/*add_prefix_space=*/true, /*use_regex=*/true);
  auto tok = FromJson(doc);
  CHECK(Encode(*tok, "the") == Ids{258});
  CHECK(Encode(*tok, " the") == Ids{258});  // Already starts with one.
  CHECK(Encode(*tok, "hello") == Ids{' ', 261});
  // Hugging Face adds it after an added token too: each piece gets one.
  CHECK(Encode(*tok, "<|eot|>the") == Ids{kEot, 258});
  CHECK(Encode(*tok, "") == Ids{});
}

TEST_CASE("GPT-2 pattern splits as Hugging Face does") {
  const std::string gpt2 = kGpt2SplitRegex;
  CHECK(Pieces(gpt2, "Hello world's  2024  hello\n\nfoo") ==
        Strings{"Hello", " world", "'s", " ", " 2024", " ", " hello", "\n", "\n", "foo"});
  // Contractions are lower-case only.
  CHECK(Pieces(gpt2, "I'M I'm") == Strings{"I", "'", "M", " I", "'m"});
  CHECK(Pieces(gpt2, "a  ") == Strings{"a", "  "});
  CHECK(Pieces(gpt2, "héllo wörld 日本語 😀!") == Strings{"héllo", " wörld", " 日本語", " 😀!"});
  CHECK(Pieces(gpt2, "x=y x²") == Strings{"x", "=", "y", " x", "²"});
  CHECK(Pieces(gpt2, "1234567") == Strings{"1234567"});
}

TEST_CASE("Llama-3 pattern splits as Hugging Face does") {
  CHECK(Pieces(kLlama3Regex, "I'M 12345 ok  hello\n\nfoo!!\n") ==
        Strings{"I", "'M", " ", "123", "45", " ok", " ", " hello", "\n\n", "foo", "!!\n"});
  CHECK(Pieces(kLlama3Regex, "IT'S HE'LL we'VE") ==
        Strings{"IT", "'S", " HE", "'LL", " we", "'VE"});
  CHECK(Pieces(kLlama3Regex, "1234567") == Strings{"123", "456", "7"});
  CHECK(Pieces(kLlama3Regex, "x=12345;  y") == Strings{"x", "=", "123", "45", ";", " ", " y"});
  // One non-letter, non-digit, non-newline character joins the next word.
  // ... but not after a space: " (" is punctuation with its space.
  CHECK(Pieces(kLlama3Regex, "x=y (hi) (yo") == Strings{"x", "=y", " (", "hi", ")", " (", "yo"});
  CHECK(Pieces(kLlama3Regex, "(hi)") == Strings{"(hi", ")"});
  CHECK(Pieces(kLlama3Regex, "a\n\n  b") == Strings{"a", "\n\n", " ", " b"});
  CHECK(Pieces(kLlama3Regex, "héllo wörld 日本語") == Strings{"héllo", " wörld", " 日本語"});
  CHECK(Pieces(kLlama3Regex, "end.  ") == Strings{"end", ".", "  "});
}

TEST_CASE("Qwen2 pattern splits digits one by one") {
  CHECK(Pieces(kQwen2Regex, "x=12345;  y") ==
        Strings{"x", "=", "1", "2", "3", "4", "5", ";", " ", " y"});
  CHECK(Pieces(kQwen2Regex, "I'M ok\n\nfoo") == Strings{"I", "'M", " ok", "\n\n", "foo"});
}

TEST_CASE("Split pre-tokenizer in a Sequence with ByteLevel") {
  Json doc = ToyJson();
  doc["pre_tokenizer"] = Sequence(SplitPre(kLlama3Regex), ByteLevelPre(false, false));
  auto llama = FromJson(doc);
  // Llama-3 cuts "12345" into "123" + "45", so the "3 4" merge cannot apply.
  CHECK(Encode(*llama, "12345") == Ids{'1', '2', '3', '4', '5'});
  CHECK(Encode(*llama, "hello world") == Ids{261, 267});

  doc["pre_tokenizer"] = Sequence(SplitPre(kQwen2Regex), ByteLevelPre(false, false));
  CHECK(Encode(*FromJson(doc), "12345") == Ids{'1', '2', '3', '4', '5'});

  // Without any regex the whole text is one word: merges cross the space.
  doc["pre_tokenizer"] = ByteLevelPre(false, false);
  auto whole = FromJson(doc);
  CHECK(Encode(*whole, "12345") == Ids{'1', '2', 268, '5'});
  CHECK(Encode(*whole, "a the") == Ids{'a', 258});

  // Removed drops the matches; a String pattern is literal.
  doc["pre_tokenizer"] =
      Sequence(Json{{"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", "Removed"}},
               ByteLevelPre(false, false));
  CHECK(Encode(*FromJson(doc), "a.b.c") == Ids{'a', 'b', 'c'});
  CHECK(Encode(*FromJson(doc), "abc") == Ids{'a', 'b', 'c'});
}

std::vector<std::string> SplitWith(std::string_view pattern, std::string_view text, SplitBehavior behavior) {
  auto re = SplitRegex::Compile(pattern, /*literal=*/true);
  REQUIRE(re.ok());
  std::vector<std::string> pieces;
  REQUIRE(SplitPieces(**re, text, behavior, false, [&](std::string_view p) { pieces.emplace_back(p); }).ok());
  return pieces;
}

TEST_CASE("Split behaviors cut as Hugging Face's documentation shows") {
  // The example in Hugging Face's SplitDelimiterBehavior documentation.
  const std::string text = "the-final--countdown";
  CHECK(SplitWith("-", text, SplitBehavior::kRemoved) == Strings{"the", "final", "countdown"});
  CHECK(SplitWith("-", text, SplitBehavior::kIsolated) ==
        Strings{"the", "-", "final", "-", "-", "countdown"});
  CHECK(SplitWith("-", text, SplitBehavior::kMergedWithPrevious) ==
        Strings{"the-", "final-", "-", "countdown"});
  CHECK(SplitWith("-", text, SplitBehavior::kMergedWithNext) ==
        Strings{"the", "-final", "-", "-countdown"});
  CHECK(SplitWith("-", text, SplitBehavior::kContiguous) == Strings{"the", "-", "final", "--", "countdown"});
  // Matches at the ends.
  CHECK(SplitWith("-", "-a-", SplitBehavior::kMergedWithPrevious) == Strings{"-", "a-"});
  CHECK(SplitWith("-", "-a-", SplitBehavior::kMergedWithNext) == Strings{"-a", "-"});
}

// A SentencePiece-style vocabulary (Llama-2's layout): <unk>, <s>, </s>, the
// 256 byte-fallback tokens, then characters and merges spelled with U+2581.
constexpr int kSpUnk = 0, kSpBos = 1;
constexpr int kSpByte0 = 3;  // <0x00>; <0xXX> is kSpByte0 + 0xXX.
constexpr int kSpMeta = 259, kSpH = 260, kSpI = 261, kSpMetaH = 262, kSpMetaHi = 263, kSpMetaMeta = 264;
const std::string kMeta = "\u2581";

Json SentencePieceJson() {
  Json vocab = {{"<unk>", kSpUnk}, {"<s>", kSpBos}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = kSpByte0 + b;
  vocab[kMeta] = kSpMeta;
  vocab["h"] = kSpH;
  vocab["i"] = kSpI;
  vocab[kMeta + "h"] = kSpMetaH;
  vocab[kMeta + "hi"] = kSpMetaHi;
  vocab[kMeta + kMeta] = kSpMetaMeta;
  Json doc;
  doc["added_tokens"] = Json::array({AddedToken(kSpUnk, "<unk>", true), AddedToken(kSpBos, "<s>", true),
                                     AddedToken(2, "</s>", true)});
  for (Json& a : doc["added_tokens"]) a["normalized"] = false;
  doc["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", Json::array({Json{{"type", "Prepend"}, {"prepend", kMeta}},
                                                    Json{{"type", "Replace"},
                                                         {"pattern", {{"String", " "}}},
                                                         {"content", kMeta}}})}};
  doc["pre_tokenizer"] = nullptr;
  doc["decoder"] = {{"type", "Sequence"},
                    {"decoders", Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                                              Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}},
                                              Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  doc["model"] = {{"type", "BPE"},     {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
                  {"vocab", vocab},    {"merges", Json::array({Json::array({kMeta, "h"}), Json::array({kMeta + "h", "i"}),
                                                               Json::array({kMeta, kMeta})})}};
  return doc;
}

Ids Fallback(std::string_view bytes) {
  Ids ids;
  for (unsigned char c : bytes) ids.push_back(kSpByte0 + c);
  return ids;
}

TEST_CASE("SentencePiece-style: Prepend and Replace normalize, characters merge, bytes fall back") {
  auto tok = FromJson(SentencePieceJson());
  CHECK(Encode(*tok, "hi") == Ids{kSpMetaHi});
  CHECK(Encode(*tok, "hi hi") == Ids{kSpMetaHi, kSpMetaHi});
  // Each piece between added tokens is normalized on its own, so each gets
  // its U+2581: " hi" becomes "\u2581\u2581hi", where "\u2581 h" (rank 0)
  // merges before "\u2581 \u2581" (rank 2) can.
  CHECK(Encode(*tok, "<s>hi</s> hi") == Ids{kSpBos, kSpMetaHi, 2, kSpMeta, kSpMetaHi});
  // No token for "é": its two UTF-8 bytes' fallback tokens.
  Ids e = {kSpMeta};
  for (int id : Fallback("\xC3\xA9")) e.push_back(id);
  e.push_back(kSpH);
  CHECK(Encode(*tok, "\xC3\xA9h") == e);
  // The decoder gives the bytes back, drops the space the normalizer put at
  // the start, and keeps it inside the text.
  CHECK(DecodeOk(*tok, e) == "\xC3\xA9h");
  CHECK(DecodeOk(*tok, {kSpMetaHi, kSpMetaHi}) == "hi hi");
  CHECK(DecodeOk(*tok, {kSpBos, kSpMetaHi}) == "<s> hi");
  CHECK(DecodeOk(*tok, {kSpBos, kSpMetaHi}, /*skip_special=*/true) == "hi");
  auto one = tok->TokenBytes(kSpMetaHi);
  REQUIRE(one.ok());
  CHECK(*one == " hi");
  // Streaming keeps the leading space: a continuation's first word needs it.
  IncrementalDetokenizer detok(tok.get());
  std::string streamed;
  for (int32_t id : {kSpMetaHi, kSpMetaHi}) streamed += detok.Push(id).value();
  CHECK(streamed == " hi hi");
}

TEST_CASE("SentencePiece-style: unknown characters without byte fallback become one fused unk") {
  Json doc = SentencePieceJson();
  doc["model"]["byte_fallback"] = false;
  auto fused = FromJson(doc);
  CHECK(Encode(*fused, "h\xC3\xA9\xC3\xA9h") == Ids{kSpMetaH, kSpUnk, kSpH});
  doc["model"]["fuse_unk"] = false;
  auto separate = FromJson(doc);
  CHECK(Encode(*separate, "h\xC3\xA9\xC3\xA9h") == Ids{kSpMetaH, kSpUnk, kSpUnk, kSpH});
}

TEST_CASE("Metaspace pre-tokenizer: spaces become U+2581, prepended per scheme, split before each") {
  Json doc = SentencePieceJson();
  doc["normalizer"] = nullptr;
  doc["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", "first"}};
  doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "always"}};
  auto always = FromJson(doc);
  // Split before each U+2581, so the pair never merges across the cut.
  CHECK(Encode(*always, "hi  hi") == Ids{kSpMetaHi, kSpMeta, kSpMetaHi});
  CHECK(Encode(*always, "<s>hi") == Ids{kSpBos, kSpMetaHi});
  doc["pre_tokenizer"]["prepend_scheme"] = "first";
  auto first = FromJson(doc);
  CHECK(Encode(*first, "hi") == Ids{kSpMetaHi});
  CHECK(Encode(*first, "<s>hi") == Ids{kSpBos, kSpH, kSpI});  // Not the text's start.
  doc["pre_tokenizer"]["prepend_scheme"] = "never";
  doc["pre_tokenizer"]["split"] = false;
  auto never = FromJson(doc);
  // Unsplit, "\u2581 h" (rank 0) wins over "\u2581 \u2581" (rank 2) again.
  CHECK(Encode(*never, "hi  hi") == Ids{kSpH, kSpI, kSpMeta, kSpMetaHi});
  // The Metaspace decoder turns U+2581 into spaces and drops the first one.
  CHECK(DecodeOk(*first, {kSpMetaHi, kSpMeta, kSpMetaHi}) == "hi  hi");
}

TEST_CASE("NFKC and NFD normalizers, alone and in a sequence") {
  Json doc = ToyJson();
  doc["normalizer"] = {{"type", "NFKC"}};
  auto nfkc = FromJson(doc);
  // U+FB01 (the fi ligature) and U+00B2 (superscript two) have compatibility
  // forms; NFC keeps both.
  CHECK(Encode(*nfkc, "\xEF\xAC\x81\xC2\xB2") == Encode(*FromJson(ToyJson()), "fi2"));
  doc["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", Json::array({Json{{"type", "NFD"}},
                                                    Json{{"type", "Replace"},
                                                         {"pattern", {{"String", "\xCC\x81"}}},
                                                         {"content", ""}}})}};
  auto strip_acute = FromJson(doc);
  // NFD splits é into e + U+0301, which the Replace then removes.
  CHECK(Encode(*strip_acute, "caf\xC3\xA9") == Encode(*FromJson(ToyJson()), "cafe"));
}

TEST_CASE("decode(encode(s)) == s on multilingual text") {
  auto tok = FromJson(ToyJson());
  for (const std::string& s : Multilingual()) {
    INFO(s);
    CHECK(DecodeOk(*tok, Encode(*tok, s)) == s);
  }
}

TEST_CASE("IncrementalDetokenizer streams whole characters only") {
  auto tok = FromJson(ToyJson());
  for (const std::string& s : Multilingual()) {
    INFO(s);
    const Ids ids = Encode(*tok, s);
    IncrementalDetokenizer detok(tok.get());
    std::string streamed;
    for (int32_t id : ids) {
      auto piece = detok.Push(id);
      REQUIRE(piece.ok());
      CHECK(IsValidUtf8(*piece));
      streamed += *piece;
    }
    streamed += detok.Finish();
    CHECK(streamed == DecodeOk(*tok, ids));
    CHECK(streamed == s);
  }

  // A character split across tokens is held back until it completes.
  const std::string cat = "\xF0\x9F\x90\xB1";  // U+1F431
  IncrementalDetokenizer detok(tok.get());
  CHECK(*detok.Push(0xF0) == "");
  CHECK(*detok.Push(0x9F) == "");
  CHECK(*detok.Push(0x90) == "");
  CHECK(*detok.Push(0xB1) == cat);
  // Invalid bytes come out as U+FFFD as soon as they are known invalid.
  CHECK(*detok.Push(0xE6) == "");
  CHECK(*detok.Push('a') == "\uFFFDa");
  CHECK(*detok.Push(0xFF) == "\uFFFD");
  // An incomplete character at the end becomes one U+FFFD.
  CHECK(*detok.Push(0xF0) == "");
  CHECK(*detok.Push(0x9F) == "");
  CHECK(detok.Finish() == "\uFFFD");
  CHECK(DecodeOk(*tok, {0xF0, 0x9F, 0x90, 0xB1, 0xE6, 'a', 0xFF, 0xF0, 0x9F}) ==
        cat + "\uFFFDa\uFFFD\uFFFD");

  // skip_special applies to the stream too; ids outside the vocab fail.
  IncrementalDetokenizer skipping(tok.get(), /*skip_special=*/true);
  CHECK(*skipping.Push(261) == "hello");
  CHECK(*skipping.Push(kEot) == "");
  CHECK(skipping.Push(280).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("UTF-8 helpers follow the maximal-subpart rule") {
  CHECK(SanitizeUtf8("plain ascii") == "plain ascii");
  CHECK(SanitizeUtf8("\xF0\x9F\x98"
                     "A") ==
        "\uFFFD"
        "A");                                                   // Truncated: one U+FFFD.
  CHECK(SanitizeUtf8("\xC0\xAF") == "\uFFFD\uFFFD");            // Overlong lead: each byte.
  CHECK(SanitizeUtf8("\xED\xA0\x80") == "\uFFFD\uFFFD\uFFFD");  // Surrogate.
  CHECK(SanitizeUtf8("\xF4\x90\x80\x80") == "\uFFFD\uFFFD\uFFFD\uFFFD");  // > U+10FFFF.
  CHECK(SanitizeUtf8("a\xE2\x82") == "a\uFFFD");
  CHECK(SanitizeUtf8("\xE2\x82\xAC") == "\u20AC");

  CHECK(CompleteUtf8Prefix("") == 0);
  CHECK(CompleteUtf8Prefix("abc\xE2\x82") == 3);
  CHECK(CompleteUtf8Prefix("a\xF0\x9F\x98") == 1);
  CHECK(CompleteUtf8Prefix("\xF0\x9F\x98\x80") == 4);
  CHECK(CompleteUtf8Prefix("abc\xC0") == 4);     // Never valid: complete.
  CHECK(CompleteUtf8Prefix("ab\xE0\x80") == 4);  // E0 80 can never become valid.
  CHECK(CompleteUtf8Prefix("\x80\x80\x80\x80\x80") == 5);

  CHECK(IsValidUtf8("héllo 😀"));
  CHECK_FALSE(IsValidUtf8("\xFF"));
  CHECK_FALSE(IsValidUtf8(std::string(20, 'a') + "\x80"));
}

TEST_CASE("Encode rejects invalid UTF-8 with the byte offset") {
  auto tok = FromJson(ToyJson());
  struct Case {
    std::string text;
    std::string offset;
  };
  const std::vector<Case> cases = {
      {std::string("ab\xFF") + "cd", "offset 2"},    // Never a UTF-8 byte.
      {"\xED\xA0\x80", "offset 0"},                  // Surrogate.
      {"abc\xE2\x82", "offset 3"},                   // Truncated.
      {std::string(20, 'a') + "\x80", "offset 20"},  // Past the ASCII fast path.
      {"\xC0\xAF", "offset 0"},                      // Overlong.
  };
  for (const Case& c : cases) {
    auto ids = tok->Encode(c.text);
    REQUIRE_FALSE(ids.ok());
    CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(ids.status().message()),
               Catch::Contains("invalid UTF-8") && Catch::Contains(c.offset));
  }
}

void ExpectLoadError(const std::string& text, const std::vector<std::string>& needles) {
  auto tok = Tokenizer::FromTokenizerJson(text, "bad/tokenizer.json");
  REQUIRE_FALSE(tok.ok());
  CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(tok.status().message());
  CHECK_THAT(message, Catch::Contains("bad/tokenizer.json"));
  for (const std::string& needle : needles) CHECK_THAT(message, Catch::Contains(needle));
}

TEST_CASE("bad tokenizer.json files are InvalidArgument naming file and field") {
  ExpectLoadError("{", {"malformed JSON"});
  const std::string full = ToyJson().dump();
  ExpectLoadError(full.substr(0, full.size() / 2), {"malformed JSON"});
  ExpectLoadError("[1, 2]", {});

  auto with = [](auto edit) {
    Json doc = ToyJson();
    edit(doc);
    return doc.dump();
  };
  ExpectLoadError(with([](Json& d) {
                    d["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
                  }),
                  {"pre_tokenizer.prepend_scheme", "\"first\""});
  ExpectLoadError(
      with([](Json& d) {
        d["pre_tokenizer"] = Sequence(Json{{"type", "Digits"}}, ByteLevelPre(false, false));
      }),
      {"pre_tokenizer.pretokenizers[0].type \"Digits\" is not supported"});
  ExpectLoadError(with([](Json& d) {
                    d["normalizer"] = {{"type", "Lowercase"}};
                  }),
                  {"normalizer.type \"Lowercase\" is not supported"});
  ExpectLoadError(
      with([](Json& d) {
        d["normalizer"] = {
            {"type", "Sequence"},
            {"normalizers", Json::array({Json{{"type", "NFKC"}}, Json{{"type", "Lowercase"}}})}};
      }),
      {"normalizer.normalizers[1].type \"Lowercase\""});
  ExpectLoadError(with([](Json& d) {
                    d["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
                  }),
                  {"normalizer.pattern", "Regex pattern is not supported"});
  ExpectLoadError(with([](Json& d) { d["normalizer"] = {{"type", "Prepend"}}; }),
                  {"normalizer.prepend is missing"});
  ExpectLoadError(with([](Json& d) { d["model"]["type"] = "WordPiece"; }),
                  {"model.type \"WordPiece\" is not supported"});
  ExpectLoadError(with([](Json& d) {
                    d["decoder"] = {{"type", "CTC"}};
                  }),
                  {"decoder.type \"CTC\" is not supported"});
  ExpectLoadError(with([](Json& d) {
                    d["decoder"] = {{"type", "Sequence"},
                                    {"decoders", Json::array({Json{{"type", "Fuse"}}, Json{{"type", "ByteFallback"}}})}};
                  }),
                  {"decoder.decoders[1].type \"ByteFallback\" after a Fuse is not supported"});
  ExpectLoadError(with([](Json& d) {
                    d["pre_tokenizer"] = Sequence(SplitPre(kLlama3Regex, "MergedSometimes"),
                                                  ByteLevelPre(false, false));
                  }),
                  {"pre_tokenizer.pretokenizers[0].behavior \"MergedSometimes\""});
  ExpectLoadError(with([](Json& d) {
                    d["pre_tokenizer"] =
                        Sequence(SplitPre("(unclosed"), ByteLevelPre(false, false));
                  }),
                  {"pre_tokenizer.pretokenizers[0].pattern.Regex", "cannot compile"});
  ExpectLoadError(with([](Json& d) {
                    d["pre_tokenizer"] = SplitPre(kLlama3Regex);
                    d["decoder"] = nullptr;
                  }),
                  {"decoder is missing", "byte-level"});
  ExpectLoadError(with([](Json& d) {
                    d["pre_tokenizer"] =
                        Sequence(ByteLevelPre(false, false), SplitPre(kLlama3Regex));
                  }),
                  {"pre_tokenizer.pretokenizers[1]", "ByteLevel must be the last"});
  ExpectLoadError(with([](Json& d) { d["model"]["merges"].push_back("h zz"); }),
                  {"model.merges[13] \"h zz\"", "token \"zz\" is not in the vocab"});
  ExpectLoadError(with([](Json& d) {
                    d["model"]["merges"].push_back(Json::array({"x", "q"}));
                  }),
                  {"model.merges[13] \"x q\"", "merged token \"xq\" is not in the vocab"});
  ExpectLoadError(with([](Json& d) { d["model"]["merges"].push_back("hq"); }),
                  {"model.merges[13]"});
  ExpectLoadError(with([](Json& d) { d["model"]["vocab"]["bad"] = -1; }), {"model.vocab[\"bad\"]"});
  ExpectLoadError(with([](Json& d) { d["model"].erase("vocab"); }), {"model.vocab"});
  ExpectLoadError(with([](Json& d) { d["added_tokens"][1].erase("content"); }),
                  {"added_tokens[1].content"});
  ExpectLoadError(with([](Json& d) { d["added_tokens"][0]["special"] = "yes"; }),
                  {"added_tokens[0].special"});
  ExpectLoadError(with([](Json& d) { d["model"]["dropout"] = 0.1; }), {"model.dropout"});
}

TEST_CASE("Decode rejects ids outside the vocabulary") {
  auto tok = FromJson(ToyJson());
  for (int32_t id : {-1, 280, 303, 1 << 30}) {
    INFO(id);
    CHECK(tok->Decode({id}).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

// GPT-2's own files for the toy vocabulary, plus <|endoftext|>.
void WriteGpt2Files(const std::string& dir, const std::string& vocab_name,
                    const std::string& merges_name) {
  Json vocab = ToyVocab();
  vocab["<|endoftext|>"] = 269;
  WriteFile(dir + "/" + vocab_name, vocab.dump());
  std::string merges = "#version: 0.2\n";
  for (const auto& [l, r] : ToyMerges()) merges += l + " " + r + "\n";
  WriteFile(dir + "/" + merges_name, merges);
}

TEST_CASE("GPT-2 file pairs load, with <|endoftext|> special") {
  for (const auto& [vocab_name, merges_name] :
       {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
    INFO(vocab_name);
    const std::string dir = TestDir(std::string("gpt2_") + vocab_name);
    WriteGpt2Files(dir, vocab_name, merges_name);
    auto tok = Tokenizer::Load(dir);
    INFO(tok.status().ToString());
    REQUIRE(tok.ok());
    CHECK(Encode(**tok, "hello<|endoftext|> the world") == Ids{261, 269, 258, 267});
    CHECK(Encode(**tok, "I'M") == Ids{'I', '\'', 'M'});
    CHECK(DecodeOk(**tok, {261, 269, 258}, /*skip_special=*/true) == "hello the");
    CHECK(DecodeOk(**tok, {261, 269, 258}) == "hello<|endoftext|> the");
    REQUIRE((*tok)->added_tokens().size() == 1);
    CHECK((*tok)->added_tokens()[0].special);
    CHECK((*tok)->vocab_size() == 270);
  }
}

TEST_CASE("Load prefers tokenizer.json and takes a file path") {
  const std::string dir = TestDir("both");
  WriteGpt2Files(dir, "vocab.json", "merges.txt");
  WriteFile(dir + "/merges.txt", "#version: 0.2\n");  // No merges: bytes only.
  auto gpt2 = Tokenizer::Load(dir);
  REQUIRE(gpt2.ok());
  CHECK(Encode(**gpt2, "hello") == Bytes("hello"));

  WriteFile(dir + "/tokenizer.json", ToyJson().dump());
  auto preferred = Tokenizer::Load(dir);
  REQUIRE(preferred.ok());
  CHECK(Encode(**preferred, "hello") == Ids{261});
  auto file = Tokenizer::Load(dir + "/tokenizer.json");
  REQUIRE(file.ok());
  CHECK(Encode(**file, "hello") == Ids{261});

  CHECK(Tokenizer::Load(dir + "/missing").status().code() == absl::StatusCode::kNotFound);
  CHECK(Tokenizer::Load(TestDir("empty")).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("bad GPT-2 files are InvalidArgument naming file, line and token") {
  const std::string dir = TestDir("gpt2_bad");
  WriteGpt2Files(dir, "vocab.json", "merges.txt");
  auto load = [&] { return Tokenizer::FromGpt2Files(dir + "/vocab.json", dir + "/merges.txt"); };

  WriteFile(dir + "/merges.txt", "#version: 0.2\nh e\nh e l\n");
  auto three = load();
  REQUIRE_FALSE(three.ok());
  CHECK(three.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(three.status().message()),
             Catch::Contains("merges.txt:3") && Catch::Contains("h e l"));

  WriteFile(dir + "/merges.txt", "#version: 0.2\nh e\nhe zz\n");
  auto unknown = load();
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(unknown.status().message()), Catch::Contains("merges.txt:3") &&
                                                          Catch::Contains("he zz") &&
                                                          Catch::Contains("token \"zz\""));

  WriteFile(dir + "/vocab.json", "{\"a\": 0,");
  auto truncated = load();
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(truncated.status().message()),
             Catch::Contains("vocab.json") && Catch::Contains("malformed JSON"));
}

// The merge rule itself, written the slow, obvious way: merge the lowest-
// ranked adjacent pair (leftmost on ties) until none applies.
Ids ReferenceBpe(const std::string& word,
                 const std::map<std::pair<std::string, std::string>, int>& rank,
                 const absl::flat_hash_map<std::string, int32_t>& id_of) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.push_back(B(static_cast<unsigned char>(c)));
  while (symbols.size() > 1) {
    int best = -1;
    int best_rank = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = rank.find({symbols[i], symbols[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best_rank)) {
        best = static_cast<int>(i);
        best_rank = it->second;
      }
    }
    if (best < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  Ids ids;
  for (const std::string& s : symbols) ids.push_back(id_of.at(s));
  return ids;
}

TEST_CASE("scan and heap merges agree with the reference on random words") {
  std::mt19937 rng(1234);
  // Random merges over a 4-letter alphabet, some spelling the same token
  // two ways, some pairs repeated (the later rank wins).
  absl::flat_hash_map<std::string, int32_t> vocab;
  for (int b = 0; b < 256; ++b) vocab[B(b)] = b;
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < 300) {
    const std::string l = tokens[rng() % tokens.size()];
    const std::string r = tokens[rng() % tokens.size()];
    if (l.size() + r.size() > 12) continue;
    merges.emplace_back(l, r);
    if (vocab.try_emplace(l + r, static_cast<int32_t>(vocab.size())).second) {
      tokens.push_back(l + r);
    }
  }
  auto model = BpeModel::Create(vocab, merges, {}, false, [](size_t) { return std::string(); });
  REQUIRE(model.ok());
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t i = 0; i < merges.size(); ++i) rank[merges[i]] = static_cast<int>(i);

  for (int trial = 0; trial < 2000; ++trial) {
    std::string word;
    const int len = 1 + rng() % (trial < 1500 ? 64 : 400);
    for (int i = 0; i < len; ++i) word.push_back("abcd"[rng() % 4]);
    INFO(word);
    const Ids expected = ReferenceBpe(word, rank, vocab);
    Ids heap, scan, cached;
    (*model)->MergeWord(word, BpeModel::Algorithm::kHeap, &heap);
    CHECK(heap == expected);
    (*model)->MergeWord(word, BpeModel::Algorithm::kScan, &scan);
    CHECK(scan == expected);
    (*model)->Encode(word, &cached);
    (*model)->Encode(word, &cached);  // The second comes from the cache.
    CHECK(Ids(cached.begin(), cached.begin() + cached.size() / 2) == expected);
    CHECK(Ids(cached.begin() + cached.size() / 2, cached.end()) == expected);
  }
}

TEST_CASE("loads what duet make-model writes and round-trips its corpus") {
  const std::vector<std::string> specials = SpecialTokensFor(ChatFormat::kLlama3);
  auto vocab = TrainByteLevelBpe(TrainingCorpus(), {2048, specials});
  REQUIRE(vocab.ok());
  const std::string dir = TestDir("made");
  REQUIRE(WriteTokenizerFiles(dir, *vocab, ChatFormat::kLlama3).ok());
  auto loaded = Tokenizer::Load(dir);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  const Tokenizer& tok = **loaded;

  const int32_t first_special = static_cast<int32_t>(vocab->tokens.size());
  CHECK(tok.vocab_size() == first_special + static_cast<int64_t>(specials.size()));
  CHECK(tok.TokenToId("<|begin_of_text|>") == first_special);
  CHECK(tok.TokenToId("<|eot_id|>") == first_special + 4);
  CHECK(Encode(tok, "<|eot_id|>") == Ids{first_special + 4});
  const Ids chat = Encode(tok, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
  REQUIRE(chat.size() >= 4);
  CHECK(chat.front() == first_special + 2);
  CHECK(chat.back() == first_special + 4);

  // Encode matches the reference merge rule word by word, and round-trips.
  const std::string_view corpus = TrainingCorpus();
  const Ids ids = Encode(tok, corpus);
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t i = 0; i < vocab->merges.size(); ++i) rank[vocab->merges[i]] = static_cast<int>(i);
  absl::flat_hash_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < vocab->tokens.size(); ++i) {
    id_of[vocab->tokens[i]] = static_cast<int32_t>(i);
  }
  auto re = SplitRegex::Compile(kGpt2SplitRegex);
  REQUIRE(re.ok());
  Ids expected;
  REQUIRE(SplitPieces(**re, corpus, SplitBehavior::kIsolated, false, [&](std::string_view w) {
            const Ids word = ReferenceBpe(std::string(w), rank, id_of);
            expected.insert(expected.end(), word.begin(), word.end());
          }).ok());
  CHECK(ids == expected);
  CHECK(ids.size() < corpus.size() / 2);  // The merges did compress.
  CHECK(DecodeOk(tok, ids) == corpus);
  for (const std::string& s : Multilingual()) {
    INFO(s);
    CHECK(DecodeOk(tok, Encode(tok, s)) == s);
  }

  // Many threads share the tokenizer (and its word cache).
  std::vector<Ids> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&tok, &r, corpus] { r = *tok.Encode(corpus); });
  }
  for (auto& t : threads) t.join();
  for (const Ids& r : results) CHECK(r == ids);
}

}  // namespace
}  // namespace duet::text

// The tokenizer corpus is big, repeatable, valid UTF-8, and holds every kind
// of text the parity tests are meant to cover.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/testing/tokenizer_corpus.h"

namespace duet::testing {
namespace {

TEST_CASE("the tokenizer corpus is at least 1 MiB and the same on every call", "[corpus]") {
  std::vector<std::string> a = TokenizerCorpus();
  size_t bytes = 0;
  for (const std::string& r : a) {
    REQUIRE_FALSE(r.empty());
    bytes += r.size();
  }
  REQUIRE(bytes >= size_t{1} << 20);
  REQUIRE(TokenizerCorpus() == a);
  REQUIRE(TokenizerCorpus(kTokenizerCorpusSeed + 1) != a);
  REQUIRE(TokenizerCorpus(kTokenizerCorpusSeed, 1000).size() < a.size());
}

TEST_CASE("every corpus record is valid UTF-8", "[corpus]") {
  for (const std::string& r : TokenizerCorpus()) {
    INFO(nlohmann::json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    // nlohmann's strict dump throws on invalid UTF-8.
    REQUIRE_NOTHROW(nlohmann::json(r).dump());
  }
}

TEST_CASE("the corpus covers contractions, code, scripts, emoji, digits and whitespace", "[corpus]") {
  std::string all;
  for (const std::string& r : TokenizerCorpus()) all += r;
  const char* const kMust[] = {
      "don't", "DON'T", "I'LL", "they've", "THEY'VE", "I'm",            // contractions, both cases
      "std::", "def ", "\":", "\n\t\t", "\n    ",                        // C++, Python, JSON, indentation
      "français", "Straße", "żółć", "tiếng",                           // accented Latin
      "привет", "我们", "日本語", "ひらがな", "안녕하세요", "𠮷",      // Cyrillic, CJK
      "مرحبا", "שלום", "नमस्ते",                                        // Arabic, Hebrew, Devanagari
      "👩‍👩‍👧‍👦", "🧑🏽‍💻", "👍🏿", "🇫🇷", "🇯🇵", "1️⃣",                 // ZWJ, skin tones, flags, keycaps
      "\r\n", "\n\n\n", "   \n", "\t\t", "      ", "\u00a0", "\u3000",  // whitespace
      "e\u0301",                                                         // a decomposed accent
  };
  for (const char* s : kMust) {
    INFO(nlohmann::json(std::string(s)).dump());
    REQUIRE(all.find(s) != std::string::npos);
  }
  // Maximal digit runs of every length from 1 to 20.
  std::set<size_t> lengths;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j] >= '0' && all[j] <= '9') ++j;
    if (j > i) lengths.insert(j - i);
    i = j > i ? j : i + 1;
  }
  for (size_t n = 1; n <= 20; ++n) {
    INFO(n << " digits");
    REQUIRE(lengths.count(n) == 1);
  }
}

}  // namespace
}  // namespace duet::testing

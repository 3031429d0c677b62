// The request fuzzer's entry point under g++ (no libFuzzer): the seed corpus
// and seeded random mutations of it (bit flips, truncations, splices,
// repeated brackets, invalid UTF-8), so the checks run in every CI build.
// The real fuzzing is `bazel run --config=fuzz //router:request_fuzzer`.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int Run(const std::string& s) { return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

TEST_CASE("the request fuzzer's checks hold on the corpus and 20000 seeded mutations") {
  std::vector<std::string> corpus;
  for (const auto& e : std::filesystem::directory_iterator("router/fuzz_corpus")) {
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    corpus.push_back(ss.str());
  }
  REQUIRE(corpus.size() >= 4);
  for (const std::string& c : corpus) REQUIRE(Run(c) == 0);
  std::mt19937_64 rng(20261130);
  const std::string tokens[] = {"[", "]", "{", "}", "\"", ",", ":", "null", "1e999", "-0", "\xff", "\xc0\xaf",
                                "\\ud800", "\"n\": 16", "\"stop\": [\"", "\"messages\": [", "\"echo\": true"};
  for (int i = 0; i < 20000; ++i) {
    std::string s = corpus[rng() % corpus.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
        case 1: s.resize(at); break;
        case 2: s.insert(at, tokens[rng() % std::size(tokens)]); break;
        case 3: s.insert(at, std::string(1 + rng() % 64, "[{"[rng() % 2])); break;
        default: s.insert(at, corpus[rng() % corpus.size()].substr(0, rng() % 40)); break;
      }
    }
    REQUIRE(Run(s) == 0);
  }
}

}  // namespace

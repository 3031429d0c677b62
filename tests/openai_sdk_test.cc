// The official OpenAI SDK for Node (the pinned `openai` npm package) against
// a real cluster: router (with --api-key) + prefill + decode processes.
// engine/testing/npm/openai_sdk_check.js asserts on every response; this test then
// checks, through /stats, that the stream the script aborted was cancelled on
// the workers: nothing running or leased, every KV block back in its pool.
// Needs node and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/cluster.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"

namespace duet::testing {
namespace {

constexpr char kScript[] = "engine/testing/npm/openai_sdk_check.js";
constexpr char kKey[] = "sk-duet-sdk-test";

// Every worker idle with its pool full, and the router with nothing in flight.
bool Drained(const nlohmann::json& stats) {
  if (stats["router"]["requests_in_flight"] != 0 || stats["router"]["attempts_in_flight"] != 0) return false;
  for (const auto& [id, w] : stats["workers"].items()) {
    if (w["running_requests"] != 0 || w["queued_requests"] != 0 || w["leased_blocks"] != 0 ||
        w["kv_blocks_free"] != w["kv_blocks_total"] || !w["fresh"].get<bool>()) {
      return false;
    }
  }
  return true;
}

TEST_CASE("the OpenAI Node SDK: every API feature, its error classes, and an abort that frees the KV") {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  Cluster c;
  REQUIRE(c.StartRouter(TinyModelDir("llama"), {"--api-key", kKey}).ok());
  REQUIRE(c.StartWorker("prefill", "prefill-0", {"--kv-blocks", "512"}).ok());
  REQUIRE(c.StartWorker("decode", "decode-0", {"--kv-blocks", "512"}).ok());
  REQUIRE(c.WaitForWorkers(2).ok());

  const std::string base = absl::StrCat("http://127.0.0.1:", c.http_port(), "/v1");
  absl::StatusOr<std::string> out = RunNodeScript(kScript, {base, kKey, "tiny-llama"}, *modules);
  if (!out.ok()) {
    INFO(c.LogTail("router"));
    FAIL(out.status().ToString());
  }
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  nlohmann::json summary = nlohmann::json::parse(lines.back(), nullptr, false);
  REQUIRE(summary.is_object());
  CHECK(summary["completion_tokens"] == 24);
  CHECK(summary["batch"] == 4);  // Two prompts x n = 2.
  CHECK(summary["aborted_after_chunks"].get<int>() >= 3);
  CHECK(summary["aborted_after_chunks"].get<int>() < 4000);

  // The abort reached the workers: the request ends as cancelled and, once
  // the workers have processed the Cancel, every block is back. Poll /stats
  // (fresh from the workers) against a deadline; nothing sleeps.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  nlohmann::json stats;
  do {
    auto s = c.Stats();
    REQUIRE(s.ok());
    stats = *s;
  } while (!Drained(stats) && absl::Now() < deadline);
  INFO(stats.dump(1));
  CHECK(Drained(stats));
  CHECK(stats["router"]["requests_cancelled"] == 1);
  CHECK(stats["router"]["requests_error"] == 0);
  // The 401s of the script's wrong-key client.
  CHECK(stats["router"]["requests_unauthorized"] == 2);
  // Both workers saw the cancelled request: decode computed fewer than the
  // 4000 tokens it was asked for.
  CHECK(stats["workers"]["decode-0"]["kv_blocks_free"] == 512);
}

}  // namespace
}  // namespace duet::testing

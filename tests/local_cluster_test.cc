// The one local-cluster launcher against real `duet` processes, and `duet up`
// (which starts its cluster through it) end to end.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/subprocess.h"
#include "engine/testing/tiny_model.h"
#include "http/client.h"
#include "tests/cluster.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char kCompletion[] = R"({"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": true})";

TEST_CASE("the launcher starts a router and numbered workers and knows where each listens", "[cluster]") {
  Cluster c;
  REQUIRE(c.StartRouter(TinyModelDir("llama")).ok());
  const absl::Status st = c.StartWorkers({{.role = "prefill", .args = {"--kv-blocks", "128"}},
                                          {.role = "decode", .args = {"--kv-blocks", "128"}}});
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(c.worker_ids() == std::vector<std::string>{"prefill-0", "decode-0"});
  auto stats = c.Stats();
  REQUIRE(stats.ok());
  CHECK((*stats)["workers"].size() == 2);
  const std::vector<pid_t> pids = c.pids();
  CHECK(pids.size() == 3);
  CHECK(std::set<pid_t>(pids.begin(), pids.end()).size() == 3);

  // The discovery file names the router's API port and each worker's own
  // metrics port, and each of them answers /metrics.
  const json targets = c.PrometheusTargets("127.0.0.1");
  REQUIRE(targets.size() == 3);
  CHECK(targets[0]["targets"][0] == absl::StrCat("127.0.0.1:", c.http_port()));
  CHECK(targets[1]["labels"]["worker"] == "prefill-0");
  CHECK(targets[2]["labels"]["role"] == "decode");
  for (const json& t : targets) {
    const std::string ep = t["targets"][0];
    int port = 0;
    REQUIRE(absl::SimpleAtoi(ep.substr(ep.find(':') + 1), &port));
    auto m = http::HttpCall("127.0.0.1", port, "GET", "/metrics");
    REQUIRE(m.ok());
    CHECK(m->status == 200);
  }
  auto r = c.Post("/v1/completions", kCompletion);
  REQUIRE(r.ok());
  CHECK(r->status == 200);
}

TEST_CASE("the launcher's errors name the process and show its log", "[cluster]") {
  Cluster c;
  SECTION("a worker before the router") {
    CHECK(c.LaunchWorker({.role = "prefill"}).status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a worker that exits during start-up") {
    REQUIRE(c.StartRouter(TinyModelDir("llama")).ok());
    CHECK(c.LaunchWorker({.role = "router"}).status().code() == absl::StatusCode::kInvalidArgument);
    const absl::Status st = c.StartWorker({.role = "decode", .args = {"--no-such-flag", "1"}});
    CHECK(st.code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StrContains(st.message(), "decode-0 exited with code 2 during start-up"));
    CHECK(absl::StrContains(st.message(), "no-such-flag"));  // from its log
  }
  SECTION("a worker killed later") {
    REQUIRE(c.StartRouter(TinyModelDir("llama")).ok());
    REQUIRE(c.StartWorker("colocated", "w", {"--kv-blocks", "64"}).ok());
    REQUIRE(c.CheckAlive().ok());
    REQUIRE(c.process("w").Signal(SIGKILL).ok());
    c.process("w").Wait();
    const absl::Status st = c.CheckAlive();
    CHECK(st.code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StartsWith(st.message(), "w killed by signal 9"));
  }
}

TEST_CASE("duet up serves the API, writes its Prometheus targets and stops on SIGTERM", "[cluster]") {
  const std::string run_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/up");
  auto up = Subprocess::StartWithPipes({fs::absolute("tools/duet").string(), "up", "--port", "0", "--model",
                                        TinyModelDir("llama"), "--threads", "1", "--kv-memory", "0.01",
                                        "--run-dir", run_dir});
  REQUIRE(up.ok());
  // Its first stdout line says where it serves.
  auto line = (*up)->ReadLine(absl::Seconds(120));
  INFO((line.ok() ? *line : line.status().ToString()));
  REQUIRE(line.ok());
  REQUIRE(absl::StartsWith(*line, "duet is serving tiny-llama at http://127.0.0.1:"));
  const std::string rest = line->substr(line->find("127.0.0.1:") + 10);
  int port = 0;
  REQUIRE(absl::SimpleAtoi(rest.substr(0, rest.find('/')), &port));
  auto r = http::HttpCall("127.0.0.1", port, "POST", "/v1/completions", kCompletion);
  REQUIRE(r.ok());
  CHECK(r->status == 200);
  std::ifstream in(run_dir + "/prometheus_targets.json");
  const json targets = json::parse(in, nullptr, false);
  REQUIRE(targets.is_array());
  CHECK(targets.size() == 3);  // router, prefill-0, decode-0
  REQUIRE((*up)->Signal(SIGTERM).ok());
  const int status = (*up)->Wait();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Its workers went with it: nothing answers on the API port any more.
  CHECK(!http::HttpCall("127.0.0.1", port, "GET", "/health", "", absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace duet::testing

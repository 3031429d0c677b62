// Debian's Prometheus server against a real cluster (router + prefill +
// decode processes), with deploy/prometheus.yml and a file-based
// service-discovery list as `duet up` writes it: the TTFT, TPOT and KV-usage
// series exist with the values the requests imply, `promtool check metrics`
// accepts every process's /metrics, and every PromQL expression of
// deploy/grafana/duet.json returns data. Needs `prometheus` and `promtool`
// (tools/setup.sh installs them); fails without them.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "base/subprocess.h"
#include "http/client.h"
#include "tests/cluster.h"
#include "tests/serving_util.h"
#include "engine/testing/tiny_model.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs a PromQL instant query; the result vector (empty on error).
json Query(int port, const std::string& expr) {
  std::string q;
  for (unsigned char c : expr) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-') {
      q += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      q += buf;
    }
  }
  auto r = http::HttpCall("127.0.0.1", port, "GET", "/api/v1/query?query=" + q, "", absl::Seconds(10));
  if (!r.ok() || r->status != 200) return json::array();
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j["status"] != "success") return json::array();
  return j["data"]["result"];
}

// `name` on $PATH (or /usr/bin): the Debian package's binaries.
std::string Which(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    fs::path candidate = fs::path(path.substr(start, end - start)) / name;
    if (!candidate.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  FAIL("cannot find " << name << " on $PATH: install it with `bash tools/setup.sh` (Debian's prometheus package)");
  return "";
}

double Value(const json& sample) { return std::stod(sample["value"][1].get<std::string>()); }

// `promtool check metrics` on a process's /metrics text: its exit status
// and what it printed.
std::pair<int, std::string> PromtoolCheck(const std::string& text, const std::string& dir) {
  const std::string in = dir + "/metrics.txt";
  {
    std::ofstream f(in);
    f << text;
  }
  const std::string cmd = absl::StrCat(Which("promtool"), " check metrics < ", in, " 2>&1");
  absl::StatusOr<CommandResult> r = RunCommand({"/bin/sh", "-c", cmd});
  REQUIRE(r.ok());
  return {WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1, r->output};
}

TEST_CASE("Prometheus scrapes every process; the dashboard's queries all return data") {
  Cluster c;
  REQUIRE(c.StartRouter(TinyModelDir("llama")).ok());
  // The prefix cache on a small device pool with a host tier, so the
  // prompts below hit, evict from both tiers and swap.
  REQUIRE(c.StartWorker("prefill", "prefill-0",
                        {"--kv-blocks", "16", "--kv-host-memory",
                         absl::StrCat(64.0 * kTinyBlockBytes / (1 << 30))})
              .ok());
  REQUIRE(c.StartWorker("decode", "decode-0", {"--kv-blocks", "256"}).ok());
  REQUIRE(c.WaitForWorkers(2).ok());

  // Traffic: kRequests completions of 6 tokens each, streamed and not.
  constexpr int kRequests = 12;
  for (int i = 0; i < kRequests; ++i) {
    auto r = c.Post("/v1/completions",
                    absl::StrCat(R"({"model": "tiny-llama", "prompt": "Request number )", i,
                                 R"(", "max_tokens": 6, "ignore_eos": true, "temperature": 0, "stream": )",
                                 i % 2 ? "true" : "false", "}"));
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
  }
  // Cache traffic: six 100-token prompts sharing their first 48 tokens,
  // twice (21 distinct full blocks for 16 on device: the second round finds
  // some on device, some on host), then twelve distinct ones (72 more
  // blocks, past device and host together: the host tier evicts too).
  int cache_requests = 0;
  auto cached_prompt = [&](int i) {
    json ids = json::array();
    for (int k = 0; k < 100; ++k) {
      ids.push_back(i < 6 ? (k < 48 ? 10 + k : 100 + 97 * i + k) : 20 + (97 * i + k) % 900);
    }
    auto r = c.Post("/v1/completions",
                    json{{"model", "tiny-llama"}, {"prompt", ids}, {"max_tokens", 2}, {"temperature", 0}}.dump());
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    ++cache_requests;
  };
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 6; ++i) cached_prompt(i);
  }
  for (int i = 6; i < 18; ++i) cached_prompt(i);
  const int kCacheRequests = cache_requests;

  // deploy/prometheus.yml, scraping every second, and the targets file.
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "prometheus";
  fs::create_directories(dir / "targets");
  std::string config = ReadFile("deploy/prometheus.yml");
  REQUIRE(config.find("scrape_interval: 5s") != std::string::npos);
  config = absl::StrReplaceAll(config, {{"scrape_interval: 5s", "scrape_interval: 1s"}});
  { std::ofstream(dir / "prometheus.yml") << config; }
  // The targets file duet up writes, from the launcher.
  json targets = c.PrometheusTargets("127.0.0.1");
  REQUIRE(targets.size() == 3);
  std::vector<std::string> endpoints;
  for (const json& t : targets) endpoints.push_back(t["targets"][0]);
  CHECK(endpoints[1] == absl::StrCat("127.0.0.1:", c.ready("prefill-0")["metrics_port"].get<int>()));
  CHECK(targets[2]["labels"]["role"] == "decode");
  // The SLA planner on this cluster, deciding every second without acting
  // (its metrics are what the dashboard's planner row reads).
  const int planner_port = FreePort();
  auto planner = Subprocess::Start(
      {fs::absolute("tools/duet").string(), "planner", "--dry-run", "--interval", "1", "--router",
       absl::StrCat("http://127.0.0.1:", c.http_port()), "--model", c.model_dir(), "--kv-memory", "0.01",
       "--metrics-port", std::to_string(planner_port)},
      {}, (dir / "planner.log").string());
  REQUIRE(planner.ok());
  targets.push_back({{"targets", {absl::StrCat("127.0.0.1:", planner_port)}}, {"labels", {{"role", "planner"}}}});
  { std::ofstream(dir / "targets" / "duet.json") << targets.dump(2); }

  // Every process's exposition passes promtool.
  for (const std::string& ep : endpoints) {
    INFO(ep);
    const int port = std::stoi(ep.substr(ep.find(':') + 1));
    auto m = http::HttpCall("127.0.0.1", port, "GET", "/metrics", "", absl::Seconds(5));
    REQUIRE(m.ok());
    REQUIRE(m->status == 200);
    auto [rc, out] = PromtoolCheck(m->body, dir.string());
    INFO(out);
    CHECK(rc == 0);
  }

  const int port = FreePort();
  auto prom = Subprocess::Start({Which("prometheus"), "--config.file=" + (dir / "prometheus.yml").string(),
                                 "--storage.tsdb.path=" + (dir / "data").string(),
                                 absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=warn"},
                                {}, (dir / "prometheus.log").string());
  REQUIRE(prom.ok());

  // Ready, every target up, and two scrapes done (rates need two samples).
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  bool up = false;
  while (!up && absl::Now() < deadline) {
    json r = Query(port,
                   "count(up == 1) == 4 and count(count_over_time(up[1m]) >= 3) == 4 and on() "
                   "count(count_over_time(duet_planner_decisions_total[1m]) >= 2) > 0");
    up = !r.empty();
  }
  INFO(ReadFile((dir / "prometheus.log").string()));
  INFO(ReadFile((dir / "planner.log").string()));
  REQUIRE(up);
  {  // The planner's exposition passes promtool too.
    auto m = http::HttpCall("127.0.0.1", planner_port, "GET", "/metrics", "", absl::Seconds(5));
    REQUIRE(m.ok());
    auto [rc, out] = PromtoolCheck(m->body, dir.string());
    INFO(out);
    CHECK(rc == 0);
  }

  // TTFT: one observation per request (both kinds of traffic), each plausible.
  json ttft = Query(port, "sum(duet_time_to_first_token_seconds_count)");
  REQUIRE(ttft.size() == 1);
  CHECK(Value(ttft[0]) == kRequests + kCacheRequests);
  json mean = Query(port, "sum(duet_time_to_first_token_seconds_sum) / sum(duet_time_to_first_token_seconds_count)");
  REQUIRE(mean.size() == 1);
  CHECK(Value(mean[0]) > 0);
  CHECK(Value(mean[0]) < 60);
  // TPOT: one per request (6 or 2 tokens each), per-token times below a second.
  json tpot = Query(port, "sum(duet_time_per_output_token_seconds_count)");
  REQUIRE(tpot.size() == 1);
  CHECK(Value(tpot[0]) == kRequests + kCacheRequests);
  json itl = Query(port, "sum(duet_inter_token_latency_seconds_count)");
  REQUIRE(itl.size() == 1);
  CHECK(Value(itl[0]) == kRequests * 5 + kCacheRequests * 1);
  json tpot_mean =
      Query(port, "sum(duet_time_per_output_token_seconds_sum) / sum(duet_time_per_output_token_seconds_count)");
  REQUIRE(tpot_mean.size() == 1);
  CHECK(Value(tpot_mean[0]) > 0);
  CHECK(Value(tpot_mean[0]) < 5);
  // KV usage: one series per worker, by role, a ratio; idle now, so 0.
  json usage = Query(port, "duet_kv_cache_usage_ratio");
  REQUIRE(usage.size() == 2);
  for (const json& s : usage) {
    CHECK((s["metric"]["role"] == "prefill" || s["metric"]["role"] == "decode"));
    CHECK(Value(s) >= 0);
    CHECK(Value(s) <= 1);
  }
  // KV transfer: the decode pulled every request's blocks.
  json moved = Query(port, "sum(duet_kv_transfer_bytes_total)");
  REQUIRE(moved.size() == 1);
  CHECK(Value(moved[0]) > 0);
  json ok = Query(port, R"(sum(duet_requests_total{status="ok"}))");
  REQUIRE(ok.size() == 1);
  CHECK(Value(ok[0]) == kRequests + kCacheRequests);
  // The prefix cache: hits on both tiers, its occupancy, swaps both ways, evictions.
  for (const char* q : {R"(sum(duet_prefix_cache_query_tokens_total{tier="device"}))",
                        R"(sum(duet_prefix_cache_hit_tokens_total{tier="device"}))",
                        R"(sum(duet_prefix_cache_hit_tokens_total{tier="host"}))",
                        R"(sum(duet_prefix_cache_usage_ratio{tier="device"}))",
                        R"(sum(duet_prefix_cache_usage_ratio{tier="host"}))",
                        R"(sum(duet_prefix_cache_swap_bytes_total{direction="to_host"}))",
                        R"(sum(duet_prefix_cache_swap_bytes_total{direction="to_device"}))",
                        R"(sum(duet_prefix_cache_evictions_total{tier="device"}))",
                        R"(sum(duet_prefix_cache_evictions_total{tier="host"}))"}) {
    INFO(q);
    json v = Query(port, q);
    REQUIRE(v.size() == 1);
    CHECK(Value(v[0]) > 0);
  }

  // The planner: the pools as the router reports them, its decisions.
  json ready = Query(port, R"(duet_planner_instances{state="ready"})");
  REQUIRE(ready.size() == 2);
  for (const json& r : ready) CHECK(Value(r) == 1);
  json decisions = Query(port, "sum(duet_planner_decisions_total)");
  REQUIRE(decisions.size() == 1);
  CHECK(Value(decisions[0]) >= 1);
  json errors = Query(port, "sum(duet_planner_errors_total)");
  REQUIRE(errors.size() == 1);
  CHECK(Value(errors[0]) == 0);

  // Every expression of the Grafana dashboard, with its variables' defaults.
  json dash = json::parse(ReadFile("deploy/grafana/duet.json"));
  std::map<std::string, std::string> vars = {{"$__rate_interval", "1m"}};
  for (const json& v : dash["templating"]["list"]) {
    if (v["type"] == "custom") vars["$" + v["name"].get<std::string>()] = v["current"]["value"];
  }
  int exprs = 0;
  for (const json& panel : dash["panels"]) {
    for (const json& t : panel["targets"]) {
      std::string expr = t["expr"];
      for (const auto& [k, v] : vars) expr = absl::StrReplaceAll(expr, {{k, v}});
      INFO(panel["title"].get<std::string>() << ": " << expr);
      CHECK(expr.find('$') == std::string::npos);
      CHECK_FALSE(Query(port, expr).empty());
      ++exprs;
    }
  }
  CHECK(exprs >= 15);
  prom.value()->Terminate(absl::Seconds(5));
  planner.value()->Terminate(absl::Seconds(5));
}

}  // namespace
}  // namespace duet::testing

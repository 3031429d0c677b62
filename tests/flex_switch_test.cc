// Flex workers (`duet worker --role flex`) on real processes: the router's
// POST /workers/role moves one from prefill to decode and back while
// requests run on it. It drains the role it has, registers again in the
// other without a restart (the same process, its weights loaded once), and
// every request of the bursts around the switches completes with the text a
// run without switches gives.
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/testing/tiny_model.h"
#include "http/client.h"
#include "tests/cluster.h"

namespace duet::testing {
namespace {

using nlohmann::json;

// Request i: a prompt of random ids, a seeded draw at temperature 0.7.
std::string Body(int i) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + i));
  json ids = json::array();
  for (int k = 0; k < 600 + 40 * (i % 5); ++k) ids.push_back(10 + rng() % 900);
  return json{{"model", "tiny-llama"}, {"prompt", ids},       {"max_tokens", 160},
              {"ignore_eos", true},    {"temperature", 0.7}, {"seed", i}}
      .dump();
}

// Sends requests [0, n) at once and runs `meanwhile` (told how many are
// still out); each one's text, or its status and body.
std::vector<std::string> Burst(int port, int n, const std::function<void(const std::atomic<int>&)>& meanwhile) {
  std::vector<std::string> out(n);
  std::vector<std::thread> threads;
  std::atomic<int> out_left{n};
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      struct Done {
        std::atomic<int>& left;
        ~Done() { --left; }
      } done{out_left};
      auto r = http::HttpCall("127.0.0.1", port, "POST", "/v1/completions", Body(i), absl::Minutes(2));
      if (!r.ok()) {
        out[i] = "error: " + r.status().ToString();
        return;
      }
      json j = json::parse(r->body, nullptr, false);
      out[i] = r->status == 200 && !j.is_discarded() ? j["choices"][0]["text"].get<std::string>()
                                                     : absl::StrCat("HTTP ", r->status, ": ", r->body);
    });
  }
  meanwhile(out_left);
  for (std::thread& t : threads) t.join();
  return out;
}

// The router's view of one worker (its /stats entry), or null.
json WorkerStats(Cluster& c, const std::string& id) {
  auto s = c.Stats();
  if (!s.ok() || !(*s)["workers"].contains(id)) return nullptr;
  return (*s)["workers"][id];
}

// Polls /stats until `ok` holds for the worker; null once `left` (a
// burst's requests still out) reaches 0 first.
json WaitFor(Cluster& c, const std::string& id, const std::function<bool(const json&)>& ok,
             const std::atomic<int>* left = nullptr) {
  for (;;) {
    json w = WorkerStats(c, id);
    if (!w.is_null() && ok(w)) return w;
    if (left != nullptr && *left == 0) return nullptr;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

TEST_CASE("a flex worker switches prefill -> decode -> prefill under load, losing no request and no weights",
          "[flex]") {
  Cluster c;
  REQUIRE(c.StartRouter(TinyModelDir("llama")).ok());
  const std::vector<std::string> kv = {"--kv-blocks", "1024"};
  const absl::Status st = c.StartWorkers({{.role = "prefill", .flex = true, .args = kv},
                                          {.role = "prefill", .args = kv},
                                          {.role = "decode", .args = kv}});
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(c.worker_ids() == std::vector<std::string>{"flex-0", "prefill-0", "decode-0"});
  const pid_t pid = c.process("flex-0").pid();
  constexpr int kRequests = 24;
  auto alone = [](const std::atomic<int>&) {};

  // The texts without a switch.
  const std::vector<std::string> expected = Burst(c.http_port(), kRequests, alone);
  for (const std::string& t : expected) REQUIRE(t.rfind("HTTP ", 0) != 0);

  // What the endpoint refuses.
  auto post_role = [&](const json& body) { return c.Post("/workers/role", body.dump(), absl::Seconds(10)); };
  CHECK(post_role({{"worker", "prefill-0"}, {"role", "decode"}})->status == 409);  // not flex
  CHECK(post_role({{"worker", "flex-0"}, {"role", "prefill"}})->status == 409);    // in that role already
  CHECK(post_role({{"worker", "flex-9"}, {"role", "decode"}})->status == 404);
  CHECK(post_role({{"worker", "flex-0"}, {"role", "colocated"}})->status == 400);
  CHECK(c.Post("/workers/role", "{", absl::Seconds(10))->status == 400);

  // prefill -> decode while prompts are queued or running on it.
  std::vector<std::string> got = Burst(c.http_port(), kRequests, [&](const std::atomic<int>& left) {
    const json busy = WaitFor(
        c, "flex-0",
        [](const json& w) { return w["queued_requests"].get<int64_t>() + w["running_requests"].get<int64_t>() > 0; },
        &left);
    CHECK(!busy.is_null());  // prompts were on it
    CHECK(c.SwitchRole("flex-0", "decode").ok());
  });
  CHECK(got == expected);
  json w = WaitFor(c, "flex-0", [](const json& w) { return w["role"] == "decode"; });
  CHECK(w["flex"] == true);
  CHECK(c.role("flex-0") == "decode");

  // decode -> prefill while requests decode on it.
  got = Burst(c.http_port(), kRequests, [&](const std::atomic<int>& left) {
    const json busy = WaitFor(c, "flex-0", [](const json& w) { return w["running_requests"].get<int64_t>() > 0; }, &left);
    CHECK(!busy.is_null());  // requests were decoding on it
    CHECK(c.SwitchRole("flex-0", "prefill").ok());
  });
  CHECK(got == expected);
  WaitFor(c, "flex-0", [](const json& w) { return w["role"] == "prefill"; });

  // And it serves as prefill again.
  CHECK(Burst(c.http_port(), kRequests, alone) == expected);

  // One process throughout, its weights loaded once, two switches.
  CHECK(c.process("flex-0").pid() == pid);
  CHECK(c.restarts("flex-0") == 0);
  const std::string log = c.LogTail("flex-0", 1 << 20);
  size_t loads = 0;
  for (size_t at = log.find(" loaded\n"); at != std::string::npos; at = log.find(" loaded\n", at + 1)) ++loads;
  CHECK(loads == 1);
  CHECK(log.find("serving decode, registering again") != std::string::npos);
  CHECK(log.find("serving prefill, registering again") != std::string::npos);
}

}  // namespace
}  // namespace duet::testing

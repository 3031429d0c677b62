// A cluster across Linux network namespaces that this test creates and
// removes: the router and two prefill and two decode workers each in its
// own namespace, joined by veth links to a bridge in a hub namespace, each
// with an address from 198.18.0.0/15 (the range set aside for benchmarking
// networks) and no route out. Workers speak UCX over TCP only
// (UCX_TLS=tcp), so every control connection and KV pull crosses a real
// interface. The test itself runs in the router's namespace. Needs root
// (ip netns); tagged local, so Bazel runs it outside its sandbox.
#include <catch2/catch.hpp>
#include <functional>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/netns.h"
#include "engine/testing/tiny_model.h"
#include "tests/catch_util.h"
#include "tests/cluster.h"
#include "tests/serving_util.h"

namespace duet::testing {
namespace {

// `tool ARGS...` (ip, tc); fails the test unless it exits 0.
std::string Run(const std::string& tool, const std::vector<std::string>& args) {
  auto out = RunTool(tool, args);
  INFO(out.status());
  REQUIRE(out.ok());
  return *out;
}

TEST_CASE("a cluster across network namespaces: the same outputs, KV bytes on the wire, and a cut link migrates "
          "its requests without leaking a block",
          "[netns]") {
  const std::vector<std::string> workers = {"prefill-0", "prefill-1", "decode-0", "decode-1"};
  std::vector<std::string> nodes = {"router"};
  nodes.insert(nodes.end(), workers.begin(), workers.end());
  auto made = Netns::Create(nodes);
  INFO(made.status());
  REQUIRE(made.ok());
  Netns& net = **made;
  auto enter = [&](const std::string& node) {
    absl::Status s = net.Enter(node);
    INFO(s);
    REQUIRE(s.ok());
  };
  auto tx_bytes = [&](const std::string& node) {
    auto b = net.TxBytes(node);
    INFO(b.status());
    REQUIRE(b.ok());
    return *b;
  };
  enter("router");  // This test's clients, and the router it starts, live there.
  const std::string dir = TinyModelDir("llama");
  const std::string model = std::filesystem::path(dir).filename().string();
  Cluster c;
  REQUIRE(c.StartRouter(dir, {"--control-listen", net.address("router") + ":0", "--missed-heartbeats", "5"},
                        {}, "127.0.0.1:0")
              .ok());
  CHECK(c.control_address().rfind(net.address("router") + ":", 0) == 0);
  std::vector<cluster::WorkerSpec> specs;
  for (const std::string& id : workers) {
    const bool prefill = id.rfind("prefill", 0) == 0;
    specs.push_back({.role = prefill ? "prefill" : "decode",
                     .id = id,
                     .args = {"--listen", net.address(id) + ":0", "--kv-blocks", "1024",
                              prefill ? "--lease-ms" : "--pull-timeout-ms", prefill ? "10000" : "30000"},
                     .env = {"UCX_TLS=tcp", "UCX_NET_DEVICES=eth0"},
                     .wrap = net.Wrap(id, {})});
  }
  REQUIRE(c.StartWorkers(specs).ok());
  for (const std::string& id : workers) {
    CHECK(c.ready(id)["control"].get<std::string>().rfind(net.address(id) + ":", 0) == 0);
  }

  // Greedy requests: the outputs one host gives, token for token.
  auto reqs = MixedRequests(40, 1000, 200, 24, 23);
  for (auto& r : reqs) r.temperature = 0;
  const int64_t tx_before = tx_bytes("prefill-0") + tx_bytes("prefill-1");
  auto want = ReferenceOutputs(dir, reqs);
  auto got = SendAll(c.http_port(), reqs, model);
  Verdicts v;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string diff = Verify(dir, got[i], want[i], reqs[i], &v);
    INFO("request " << i << ": " << diff);
    REQUIRE(diff.empty());
  }
  CHECK(v.exact == static_cast<int>(reqs.size()));
  // Every pulled KV byte left a prefill's namespace through its veth.
  auto s = WaitStats(c.http_port(), AllIdle);
  int64_t pulled = 0;
  for (const char* d : {"decode-0", "decode-1"}) pulled += s["workers"][d]["kv_bytes_moved"].get<int64_t>();
  const int64_t tx = tx_bytes("prefill-0") + tx_bytes("prefill-1") - tx_before;
  INFO("KV pulled " << pulled << " bytes; the prefills' veths sent " << tx);
  CHECK(pulled > 0);
  CHECK(tx >= pulled);

  // Slow the KV flowing to decode-0 (its veth's hub end sends it), so pulls
  // are in flight, then cut decode-0's link.
  Run("tc", {"-n", net.Name("hub"), "qdisc", "add", "dev", net.HubEnd("decode-0"), "root", "tbf", "rate", "8mbit",
             "burst", "16kbit", "latency", "2s"});
  auto slow = MixedRequests(24, 1000, 400, 48, 29);
  for (auto& r : slow) {
    r.temperature = 0;
    r.max_tokens = 48;
    r.prompt.resize(std::max<size_t>(r.prompt.size(), 300), 17);  // Some KV to pull.
  }
  auto slow_want = ReferenceOutputs(dir, slow);
  std::vector<ParsedCompletion> slow_got;
  // decode-0's metrics listen on loopback in its namespace, which this
  // thread visits once the load's threads have started from the router's.
  const int metrics_port = c.ready("decode-0")["metrics_port"].get<int>();
  std::thread load([&] { slow_got = SendAll(c.http_port(), slow, model); });
  enter("decode-0");
  // Polls decode-0's transfer metrics (each scrape a round trip) until `done`
  // holds or `timeout` passes.
  auto poll = [&](const std::function<bool()>& done, absl::Duration timeout) {
    for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
      if (done()) return true;
    }
    return false;
  };
  // A pull in flight: cut the link.
  CHECK(poll([&] { return MetricValue(metrics_port, "duet_kv_transfers_in_flight", "") > 0; }, absl::Seconds(60)));
  Run("ip", {"-n", net.Name("decode-0"), "link", "set", "eth0", "down"});
  const absl::Time cut = absl::Now();
  // The pulls in flight end as peer lost once TCP gives up on the link:
  // keepalive probes (1 s idle, 1 s apart, 3 of them) or, on a socket that
  // held unacknowledged data at the cut, the user timeout of the same 4 s
  // that the transport gives UCX's sockets; never at the pull timeout these
  // decodes run with (30 s).
  double lost = 0, timed_out = 0;
  poll([&] {
    lost = MetricValue(metrics_port, "duet_kv_transfer_failures_total", "reason=\"peer_lost\"");
    timed_out = MetricValue(metrics_port, "duet_kv_transfer_failures_total", "reason=\"timed_out\"");
    return lost + timed_out > 0;
  }, absl::Seconds(60));
  const absl::Duration detected = absl::Now() - cut;
  enter("router");
  load.join();
  WARN("decode-0's pulls failed " << absl::FormatDuration(detected) << " after its link was cut: " << lost
                                 << " peer lost, " << timed_out << " timed out");
  CHECK(lost > 0);
  CHECK(timed_out == 0);
  for (size_t i = 0; i < slow.size(); ++i) {
    INFO("request " << i << " error: " << slow_got[i].error);
    REQUIRE(slow_got[i].error.empty());
    std::string diff = Verify(dir, slow_got[i], slow_want[i], slow[i], &v);
    INFO("request " << i << ": " << diff);
    REQUIRE(diff.empty());
  }
  // The router dropped decode-0 and moved its requests; the prefills' leases
  // for it came back.
  s = WaitStats(c.http_port(), [](const nlohmann::json& s) { return s["workers"].size() == 3 && AllIdle(s); },
                absl::Seconds(60));
  INFO(s.dump());
  CHECK(s["router"]["migrations"].get<int>() > 0);
  CHECK(s["router"]["requests_error"] == 0);
}

}  // namespace
}  // namespace duet::testing

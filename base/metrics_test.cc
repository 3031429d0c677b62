#include "base/metrics.h"

#include <catch2/catch.hpp>
#include <thread>

namespace duet {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("counters, gauges and histograms render in the Prometheus text format", "[metrics]") {
  MetricsRegistry r;
  r.GetCounter("duet_requests_total", "Requests by status", {{"status", "ok"}})->Increment(3);
  r.GetCounter("duet_requests_total", "Requests by status", {{"status", "error"}})->Increment();
  r.GetGauge("duet_kv_cache_usage_ratio", "KV usage", {{"role", "decode"}, {"worker", "d\"1"}})->Set(0.25);
  Histogram* h = r.GetHistogram("duet_kv_transfer_seconds", "Transfer time", {{"transport", "ucx"}},
                                {0.1, 1.0});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(7);
  std::string text = r.RenderText();
  REQUIRE_THAT(text, Contains("# TYPE duet_requests_total counter\n"));
  REQUIRE_THAT(text, Contains("duet_requests_total{status=\"ok\"} 3\n"));
  REQUIRE_THAT(text, Contains("duet_requests_total{status=\"error\"} 1\n"));
  REQUIRE_THAT(text, Contains("duet_kv_cache_usage_ratio{role=\"decode\",worker=\"d\\\"1\"} 0.25\n"));
  REQUIRE_THAT(text, Contains("duet_kv_transfer_seconds_bucket{transport=\"ucx\",le=\"0.1\"} 1\n"));
  REQUIRE_THAT(text, Contains("duet_kv_transfer_seconds_bucket{transport=\"ucx\",le=\"1\"} 2\n"));
  REQUIRE_THAT(text, Contains("duet_kv_transfer_seconds_bucket{transport=\"ucx\",le=\"+Inf\"} 3\n"));
  REQUIRE_THAT(text, Contains("duet_kv_transfer_seconds_sum{transport=\"ucx\"} 7.55\n"));
  REQUIRE_THAT(text, Contains("duet_kv_transfer_seconds_count{transport=\"ucx\"} 3\n"));
}

TEST_CASE("the same name and labels give the same series", "[metrics]") {
  MetricsRegistry r;
  Counter* a = r.GetCounter("x_total", "x", {{"k", "v"}});
  REQUIRE(r.GetCounter("x_total", "x", {{"k", "v"}}) == a);
  REQUIRE(r.GetCounter("x_total", "x", {{"k", "w"}}) != a);
}

TEST_CASE("concurrent increments are not lost", "[metrics]") {
  MetricsRegistry r;
  Counter* c = r.GetCounter("c_total", "c");
  Gauge* g = r.GetGauge("g", "g");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        g->Increment(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(c->Value() == 40000);
  REQUIRE(g->Value() == 40000);
}

}  // namespace
}  // namespace duet

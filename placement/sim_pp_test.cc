// Pipeline parallelism adds throughput, not speed: through the latency
// models (DistServe's fit, the roofline) and the simulator, a batch on pp
// stages takes about as long as on one, and with free hand-offs an instance
// of pp stages serves pp times the load.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"

namespace duet::placement {
namespace {

constexpr char kFit[] = "placement/testdata/distserve-a100-80g.json";

ModelSpec Opt13b() { return ModelPreset("opt-13b").value(); }

// One prefill and one decode instance of (tp 1, pp), KV moving instantly.
ClusterSpec PrefillDecode(int pp) {
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = pp}},
                 {.role = InstanceRole::kDecode, .par = {.tp = 1, .pp = pp}}};
  return c;
}

struct Latencies {
  double ttft, tpot;
};

Latencies OneRequest(LatencyModel& lat, int pp) {
  // A 1,000-token prompt and 10 decode steps.
  const std::vector<SimRequest> one = {{.arrival = 0, .prompt = 1000, .output = 11}};
  SimResult r = Simulate(PrefillDecode(pp), Opt13b(), lat, one);
  REQUIRE(r.requests.size() == 1);
  return {r.requests[0].ttft(), r.requests[0].tpot()};
}

TEST_CASE("a request's TTFT and TPOT on 2 and 4 stages stay within 15% above one stage's", "[placement]") {
  auto fit = LoadLatencyModel(kFit, Opt13b());
  REQUIRE(fit.ok());
  auto roofline = NewRooflineLatency(Opt13b(), LoadGpu("a100-80g").value());
  for (LatencyModel* lat : {fit->get(), roofline.get()}) {
    INFO(lat->Describe());
    const Latencies base = OneRequest(*lat, 1);
    REQUIRE(base.ttft > 0.05);  // a real prefill: tens of ms at least
    REQUIRE(base.tpot > 0.005);
    for (int pp : {2, 4}) {
      INFO("pp " << pp);
      const Latencies l = OneRequest(*lat, pp);
      CHECK(l.ttft >= base.ttft);
      CHECK(l.ttft <= 1.15 * base.ttft);
      CHECK(l.tpot >= base.tpot);
      CHECK(l.tpot <= 1.15 * base.tpot);
    }
  }
}

TEST_CASE("with free hand-offs, saturated prefill and decode throughput grow with the stages", "[placement]") {
  auto fit = LoadDistServeFit(kFit, Opt13b());
  REQUIRE(fit.ok());
  fit->pp_stage_overhead_s = 0;
  auto lat = NewDistServeLatency(*fit, "no hand-off cost");
  DecodeOnlyLatency decode_only(*lat);  // the decode instance alone
  // Everything arrives at once; throughput is requests (or tokens) over the makespan.
  std::vector<SimRequest> prompts(400, SimRequest{.arrival = 0, .prompt = 1000, .output = 1});
  std::vector<SimRequest> decodes(1024, SimRequest{.arrival = 0, .prompt = 1000, .output = 101});
  double prefill_base = 0, decode_base = 0;
  for (int pp : {1, 2, 4}) {
    INFO("pp " << pp);
    ClusterSpec prefill;
    prefill.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = pp}}};
    const double prefill_rate = 400 / Simulate(prefill, Opt13b(), *lat, prompts).makespan;
    const SimResult d = Simulate(PrefillDecode(pp), Opt13b(), decode_only, decodes);
    const double decode_rate = 1024.0 * 100 / d.makespan;  // decode tokens per second
    if (pp == 1) {
      prefill_base = prefill_rate;
      decode_base = decode_rate;
      continue;
    }
    CHECK(prefill_rate / prefill_base == Approx(pp).epsilon(0.10));
    CHECK(decode_rate / decode_base == Approx(pp).epsilon(0.10));
  }
}

TEST_CASE("a pipeline's hand-off cost is paid once per stage boundary", "[placement]") {
  auto fit = LoadDistServeFit(kFit, Opt13b());
  REQUIRE(fit.ok());
  fit->pp_stage_overhead_s = 0.004;
  auto lat = NewDistServeLatency(*fit, "4 ms hand-offs");
  const std::vector<int64_t> prompt = {1000};
  const double one = lat->Prefill({.tp = 1, .pp = 1}, prompt);
  CHECK(lat->Prefill({.tp = 1, .pp = 2}, prompt) == Approx(one + 0.004));
  CHECK(lat->Prefill({.tp = 1, .pp = 4}, prompt) == Approx(one + 3 * 0.004));
  CHECK(PipelineSeconds(0.1, 1, 1.0) == 0.1);
}

}  // namespace
}  // namespace duet::placement

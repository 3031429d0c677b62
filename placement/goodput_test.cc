// FindGoodput's bisection: a configuration that misses the targets even at
// 1/1000 of the workload's rate has no goodput, told in two simulations
// (the rate tried and the floor) rather than by stepping down to the floor;
// one that meets them returns a rate that meets them, with 1.25x missing.
#include <catch2/catch.hpp>
#include <vector>

#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"

namespace duet::placement {
namespace {

ClusterSpec OnePair() {
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}},
                 {.role = InstanceRole::kDecode, .par = {.tp = 1, .pp = 1}}};
  return c;
}

std::vector<SimRequest> Workload() {
  std::vector<SimRequest> w;
  for (int i = 0; i < 400; ++i) w.push_back({.arrival = 0.1 * i, .prompt = 1000, .output = 20});
  return w;
}

TEST_CASE("targets missed at any rate: no goodput, in two simulations with or without a hint", "[placement]") {
  const ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel("placement/testdata/distserve-a100-80g.json", m);
  REQUIRE(lat.ok());
  const std::vector<SimRequest> w = Workload();
  // A 1,000-token prompt alone takes about 127 ms: a 50 ms TTFT is never met.
  for (double hint : {0.0, 3.0}) {
    INFO("hint " << hint);
    const Goodput g = FindGoodput(OnePair(), m, **lat, w, {.ttft = 0.05, .tpot = 1}, 0.9, 0.02, hint);
    CHECK(g.rate == 0);
    CHECK(g.simulations == 2);
  }
  const Goodput ok = FindGoodput(OnePair(), m, **lat, w, {.ttft = 0.5, .tpot = 1}, 0.9, 0.02);
  REQUIRE(ok.rate > 0);
  CHECK(ok.attainment >= 0.9);
  CHECK(Simulate(OnePair(), m, **lat, AtRate(w, 1.25 * ok.rate)).Attainment({.ttft = 0.5, .tpot = 1}) < 0.9);
}

}  // namespace
}  // namespace duet::placement

// duet profile's idle penalty in the DistServe loader and the simulator
// (charged after the whole cluster sat idle), and
// the cost of a colocated step that mixes decode rows into a prompt chunk.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"
#include "placement/workload.h"

namespace duet::placement {
namespace {

std::string WriteProfile(const nlohmann::json& extra) {
  // Prefill 100 ms + 1 ms a token; decode 20 ms + 0.01 ms a context token.
  nlohmann::json entry = {{"1",
                           {{"decoding_large_small_bs_threshold", 1 << 30},
                            {"prefill", {100.0, 1.0, 0.0}},
                            {"decoding_smallbs", {20.0, 0.01, 0.0}},
                            {"decoding_largebs", {20.0, 0.01, 0.0}}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) entry[it.key()] = it.value();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("duet-idle-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << nlohmann::json{{"opt-13b", entry}}.dump();
  return path;
}

TEST_CASE("idle_penalty_ms is read and interpolated; malformed points are refused", "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel(WriteProfile({{"idle_penalty_ms", {{1.0, 100.0}, {5.0, 300.0}}}}), m);
  REQUIRE(lat.ok());
  CHECK((*lat)->IdlePenalty(0) == 0);
  CHECK((*lat)->IdlePenalty(0.5) == Approx(0.050));
  CHECK((*lat)->IdlePenalty(3.0) == Approx(0.200));
  CHECK((*lat)->IdlePenalty(60.0) == Approx(0.300));
  auto plain = LoadLatencyModel(WriteProfile({}), m);
  REQUIRE(plain.ok());
  CHECK((*plain)->IdlePenalty(60.0) == 0);
  for (const nlohmann::json& bad : {nlohmann::json{{"idle_penalty_ms", {{5.0, 1.0}, {1.0, 2.0}}}},
                                    nlohmann::json{{"idle_penalty_ms", {{1.0}}}},
                                    nlohmann::json{{"idle_penalty_ms", "cold"}}}) {
    auto r = LoadLatencyModel(WriteProfile(bad), m);
    INFO(bad.dump());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("a prefill after an idle spell pays the penalty; one right after another does not", "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel(WriteProfile({{"idle_penalty_ms", {{1.0, 100.0}, {5.0, 300.0}}}}), m);
  REQUIRE(lat.ok());
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill}, {.role = InstanceRole::kDecode}};
  // 50-token prompts (150 ms prefill) at 10 s (idle 10 s: +300 ms, ends at
  // 10.45), at 10.15 s (queued behind it: no idle, ends at 10.60), and at
  // 13 s (idle 2.4 s: +100 + 200 x 1.4 / 4 = +170 ms).
  std::vector<SimRequest> reqs = {{10.0, 50, 1}, {10.15, 50, 1}, {13.0, 50, 1}};
  SimResult r = Simulate(c, m, **lat, reqs);
  REQUIRE(r.requests.size() == 3);
  CHECK(r.requests[0].ttft() == Approx(0.150 + 0.300));
  CHECK(r.requests[1].ttft() == Approx(0.450 - 0.150 + 0.150));
  CHECK(r.requests[2].ttft() == Approx(0.150 + 0.170));

  // The decode steps right after a prefill pay nothing: the cluster was not
  // idle. Steps at contexts 51 and 52: 20.51 and 20.52 ms.
  std::vector<SimRequest> one = {{10.0, 50, 3}};
  SimResult d = Simulate(c, m, **lat, one);
  CHECK(d.requests[0].ttft() == Approx(0.150 + 0.300));
  CHECK(d.requests[0].tpot() == Approx((20.51 + 20.52) / 2 / 1e3));
}

TEST_CASE("a chunked colocated step with decode rows costs one prefill of all its tokens plus attention",
          "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel(WriteProfile({}), m);
  REQUIRE(lat.ok());
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kColocated}};
  c.chunked_prefill = true;
  c.chunk_tokens = 512;
  // A 10-token prompt generating 3 tokens (prefill 110 ms, then decode
  // steps of 20 ms + 0.01 ms a context token), and a 200-token prompt that
  // arrives during its first decode step (0.110 to 0.13011). The next step
  // mixes the decode row (context 12) with the whole prompt: one prefill of
  // 201 tokens (100 + 201 ms) plus that row's attention beyond a context of
  // 1 (0.01 x 11 ms), not a decode step and a prefill one after the other.
  std::vector<SimRequest> reqs = {{0.0, 10, 3}, {0.115, 200, 1}};
  SimResult r = Simulate(c, m, **lat, reqs);
  REQUIRE(r.requests.size() == 2);
  CHECK(r.requests[0].ttft() == Approx(0.110));
  const double first_decode_end = 0.110 + (20 + 0.01 * 11) / 1e3;
  CHECK(r.requests[1].first_token == Approx(first_decode_end + (100 + 201 + 0.01 * 11) / 1e3));
}

}  // namespace
}  // namespace duet::placement

// duet profile's extensions of DistServe's format in the loader and the
// simulator: the idle penalty (charged after the whole cluster sat idle)
// and the per-batch decode table; the cost of a colocated step that mixes
// decode rows into a prompt chunk; and an instance's scaled latency model.
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

TEST_CASE("decoding_by_batch replaces the two regimes: linear between batches, rising past the last",
          "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  // Batch 1: 30 + 0.01 ms a context token; batch 2: 50 + 0.02; batch 4:
  // 60 + 0.02. The two regimes (20 + 0.01 sum) must not be used.
  auto lat = LoadLatencyModel(
      WriteProfile({{"1",
                     {{"decoding_large_small_bs_threshold", 1 << 30},
                      {"prefill", {100.0, 1.0, 0.0}},
                      {"decoding_smallbs", {20.0, 0.01, 0.0}},
                      {"decoding_largebs", {20.0, 0.01, 0.0}},
                      {"decoding_by_batch", nlohmann::json::parse("[[1, 30, 0.01], [2, 50, 0.02], [4, 60, 0.02]]")}}}}),
      m);
  REQUIRE(lat.ok());
  const Parallel p{.tp = 1, .pp = 1};
  const std::vector<int64_t> one = {100}, two = {100, 100}, three = {100, 100, 100}, six(6, 100);
  CHECK((*lat)->Decode(p, one) == Approx((30 + 1.0) / 1e3));
  CHECK((*lat)->Decode(p, two) == Approx((50 + 4.0) / 1e3));
  // Halfway from batch 2 (50 + 6 at sum 300) to batch 4 (60 + 6).
  CHECK((*lat)->Decode(p, three) == Approx((56 + 66) / 2.0 / 1e3));
  // Past batch 4: batch 4's step at sum 600 (60 + 12), each further
  // sequence adding the 2 -> 4 slope of `a` ((60 - 50) / 2).
  CHECK((*lat)->Decode(p, six) == Approx((72 + 2 * 5.0) / 1e3));
  for (const char* text : {"[[2, 1, 0], [1, 1, 0]]", "[[0, 1, 0]]", "[[1, 1]]", "[]", "\"fast\""}) {
    const nlohmann::json bad = nlohmann::json::parse(text);
    auto r = LoadLatencyModel(WriteProfile({{"1",
                                             {{"prefill", {100.0, 1.0, 0.0}},
                                              {"decoding_smallbs", {20.0, 0.01, 0.0}},
                                              {"decoding_largebs", {20.0, 0.01, 0.0}},
                                              {"decoding_by_batch", bad}}}}),
                              m);
    INFO(bad.dump());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("past the table, a decode step's context is priced at the last batch's rate, not at the rates' slope",
          "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  // The per-token rate rises from 0.02 (batch 2) to 0.03 (batch 4), as a
  // CPU's does when a batch's context leaves the cache. 64 rows of 1000
  // context tokens: batch 4's 60 + 0.03 x 64000, plus 60 rows at 5 ms (the
  // 2 -> 4 slope of a). Extrapolating the whole step's slope would add
  // (0.03 - 0.02) x 64000 / 2 ms a row instead: 20 s a step.
  auto lat = LoadLatencyModel(
      WriteProfile({{"1",
                     {{"prefill", {100.0, 1.0, 0.0}},
                      {"decoding_smallbs", {20.0, 0.01, 0.0}},
                      {"decoding_largebs", {20.0, 0.01, 0.0}},
                      {"decoding_by_batch", nlohmann::json::parse("[[1, 30, 0.01], [2, 50, 0.02], [4, 60, 0.03]]")}}}}),
      m);
  REQUIRE(lat.ok());
  const std::vector<int64_t> rows(64, 1000);
  CHECK((*lat)->Decode({.tp = 1, .pp = 1}, rows) == Approx((60 + 0.03 * 64000 + 60 * 5.0) / 1e3));
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

TEST_CASE("a decode instance admits and starts pulls at a step's start; a pulled request joins the next step",
          "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel("constant:0.1,0.02", m);  // prefill 100 ms, decode step 20 ms
  REQUIRE(lat.ok());
  ClusterSpec c;
  c.instances = {{.role = InstanceRole::kPrefill}, {.role = InstanceRole::kDecode}};
  // A 10-token prompt's KV (10 tokens of opt-13b) crosses the link in 5 ms.
  c.kv_link_bytes_per_s = 10.0 * static_cast<double>(m.KvBytesPerToken()) / 0.005;
  // A: first token at 0.100, pulled by 0.105 (the decode instance was idle),
  // then steps end at 0.125, 0.145, ... B: first token at 0.310, during the
  // step [0.305, 0.325]; admitted at 0.325, its pull ends at 0.330 during
  // the step [0.325, 0.345], so its one decode step is [0.345, 0.365].
  std::vector<SimRequest> reqs = {{0.0, 10, 100}, {0.21, 10, 2}};
  SimResult r = Simulate(c, m, **lat, reqs);
  REQUIRE(r.requests.size() == 2);
  CHECK(r.requests[0].first_token == Approx(0.100));
  CHECK(r.requests[0].finish == Approx(0.105 + 99 * 0.020));
  CHECK(r.requests[1].first_token == Approx(0.310));
  CHECK(r.requests[1].finish == Approx(0.365));
}

TEST_CASE("a chunked colocated step carries its decode rows as one-token prompts plus their attention", "[placement]") {
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
  // mixes the decode row (context 12) with the whole prompt in one pass: a
  // prefill of the prompt and the row as one token (100 + 200 + 1 ms) plus
  // the row's attention (0.12 ms), not the two steps one after the other.
  std::vector<SimRequest> reqs = {{0.0, 10, 3}, {0.115, 200, 1}};
  SimResult r = Simulate(c, m, **lat, reqs);
  REQUIRE(r.requests.size() == 2);
  CHECK(r.requests[0].ttft() == Approx(0.110));
  const double first_decode_end = 0.110 + (20 + 0.01 * 11) / 1e3;
  CHECK(r.requests[1].first_token == Approx(first_decode_end + (100 + 200 + 1 + 0.01 * 12) / 1e3));
}

TEST_CASE("a scaled latency model stretches each step by its rows' factor, not the idle penalty, for its instance only",
          "[placement]") {
  ModelSpec m = ModelPreset("opt-13b").value();
  auto lat = LoadLatencyModel(WriteProfile({{"idle_penalty_ms", {{1.0, 100.0}, {5.0, 300.0}}}}), m);
  REQUIRE(lat.ok());
  // Prefill (0 rows) x1.2; decode x1.0 at 1 row, x1.4 at 5 rows and past.
  auto slow = NewScaledLatency(lat->get(), {{0, 1.2}, {1, 1.0}, {5, 1.4}});
  const int64_t prompt[1] = {50};
  const int64_t one[1] = {200};
  const int64_t three[3] = {100, 100, 200};
  const int64_t eight[8] = {50, 50, 50, 50, 50, 50, 50, 50};
  CHECK(slow->Prefill({}, prompt) == Approx(1.2 * 0.150));
  CHECK(slow->Decode({}, one) == Approx(1.0 * (20 + 0.01 * 200) / 1e3));
  CHECK(slow->Decode({}, three) == Approx(1.2 * (20 + 0.01 * 400) / 1e3));
  CHECK(slow->Decode({}, eight) == Approx(1.4 * (20 + 0.01 * 400) / 1e3));
  CHECK(slow->IdlePenalty(2.0) == Approx((*lat)->IdlePenalty(2.0)));
  CHECK(FactorAtRows({}, 3) == 1.0);
  // A mixed pass: the prompt and the 3 rows as one-token prompts (x1.2)
  // plus the rows' attention over 400 context tokens (3 rows: x1.2).
  CHECK(ForwardPassSeconds(*slow, {}, prompt, three) == Approx(1.2 * 0.153 + 1.2 * 0.004));

  // Two colocated instances, round robin: the first runs at the profile's
  // speed, the second 1.5 times slower. 50-token prompts (150 ms), each
  // after some 10 s of idling (+300 ms, unscaled).
  auto slower = NewScaledLatency(lat->get(), {{0, 1.5}});
  ClusterSpec c;
  c.policy = "round_robin";
  c.instances = {{.role = InstanceRole::kColocated}, {.role = InstanceRole::kColocated, .latency = slower.get()}};
  std::vector<SimRequest> reqs = {{10.0, 50, 1}, {20.0, 50, 1}, {30.0, 50, 1}};
  SimResult r = Simulate(c, m, **lat, reqs);
  REQUIRE(r.requests.size() == 3);
  CHECK(r.requests[0].ttft() == Approx(0.300 + 0.150));
  CHECK(r.requests[1].ttft() == Approx(0.300 + 1.5 * 0.150));
  CHECK(r.requests[2].ttft() == Approx(0.300 + 0.150));
}

}  // namespace
}  // namespace duet::placement

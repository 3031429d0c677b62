// duet up --autoscale --switch-roles's planner and local actuator on real
// processes (a router and one-thread flex workers of the tiny model, on
// this machine's two cores with up to three workers, as `--cores 4
// --max-workers 4` allows), under three phases of load from an open-loop
// client: prefill-heavy (long prompts, short outputs), decode-heavy (short
// prompts, long outputs) and quiet. The prefill pool must grow in the first
// (a start), the decode pool in the second (at the bound of three: a
// prefill worker switched to decode, not a drain and a start), the cluster
// shrink back in the third (a drain), each phase changing direction at
// most once; each decision must be the planner's simulation of the figures
// the router reported (replayed offline to the same decisions); and every
// request must complete, those on workers switched or drained away
// included (each retired worker exits 0 after its drain).
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "autoscale/live_planner.h"
#include "autoscale/local_actuator.h"
#include "autoscale/local_run.h"
#include "engine/testing/tiny_model.h"
#include "http/client.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/planner.h"

namespace duet::autoscale {
namespace {

namespace fs = std::filesystem;

// The open-loop client: each arrival on its own thread at its time, a
// completion of random prompt tokens with ignore_eos; its HTTP status and
// the tokens it got (or the error).
struct Sent {
  int status = 0;
  int64_t tokens = 0;
  std::string error;
};
std::vector<Sent> SendAll(int port, const std::string& model, const std::vector<LocalArrival>& arrivals) {
  std::vector<Sent> out(arrivals.size());
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < arrivals.size(); ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(static_cast<uint32_t>(i));
      nlohmann::json ids = nlohmann::json::array();
      for (int64_t k = 0; k < arrivals[i].prompt; ++k) ids.push_back(10 + rng() % 900);
      const std::string body = nlohmann::json{{"model", model},         {"prompt", ids},
                                              {"max_tokens", arrivals[i].output}, {"ignore_eos", true},
                                              {"temperature", 0}}
                                   .dump();
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<int64_t>(arrivals[i].t * 1e6)));
      auto r = http::HttpCall("127.0.0.1", port, "POST", "/v1/completions", body, absl::Minutes(5));
      if (!r.ok()) {
        out[i].error = std::string(r.status().message());
        return;
      }
      out[i].status = r->status;
      nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
      if (r->status != 200 || j.is_discarded()) {
        out[i].error = r->body.substr(0, 300);
        return;
      }
      out[i].tokens = j["usage"].value("completion_tokens", int64_t{0});
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST_CASE("the planner grows prefill, then decode, then shrinks, on real processes, losing no request") {
  const std::string dir = testing::TinyModelDir("llama");
  const fs::path tmp = std::getenv("TEST_TMPDIR");
  // The planner's model of one worker: this machine, one thread.
  const std::string profile = (tmp / "worker-profile.json").string();
  const absl::Status prof =
      ProfileWorker(fs::absolute("tools/duet").string(), dir, profile, (tmp / "profile.log").string());
  INFO(prof.message());
  REQUIRE(prof.ok());

  LocalRunOptions o;
  o.model_dir = dir;
  o.run_dir = (tmp / "cluster").string();
  o.autoscale = true;
  o.latency_file = profile;
  o.max_workers = 3;  // --cores 4: the router and the planner take one
  o.interval_s = 5;
  o.planner.slo = {.ttft = 1.0, .tpot = 0.005};
  o.planner.cooldown_s = 15;
  o.planner.switch_roles = true;
  // Each heavy phase past what one worker of its pool serves within the SLO
  // here, within what two do.
  const std::vector<LocalPhase> phases = {
      {"prefill-heavy", 25, 6, 900, 4}, {"decode-heavy", 25, 10, 16, 400}, {"quiet", 45, 0.2, 16, 8}};
  o.seconds = PhasesSeconds(phases);
  std::vector<std::string> lines;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  const std::vector<LocalArrival> arrivals = PhaseArrivals(phases, 1);
  std::vector<Sent> sent;
  absl::StatusOr<LocalRunResult> r =
      RunLocal(o, [&](int port) { sent = SendAll(port, fs::path(dir).filename().string(), arrivals); });
  REQUIRE(r.ok());
  std::string all_lines;
  for (const std::string& l : lines) all_lines += l + "\n";
  INFO(all_lines);

  // Every request completed, with every token it asked for.
  REQUIRE(sent.size() == arrivals.size());
  REQUIRE(sent.size() > 300);
  for (size_t i = 0; i < sent.size(); ++i) {
    INFO(sent[i].error);
    CHECK(sent[i].status == 200);
    CHECK(sent[i].tokens == arrivals[i].output);
  }

  // Per phase: the pools' sizes the planner set, and the direction changes.
  std::map<std::string, int> max_prefill, max_decode, changes;
  std::map<std::string, int> last_direction;
  int final_prefill = 1, final_decode = 1;
  for (const LocalDecision& d : r->decisions) {
    const std::string& phase = PhaseAt(phases, d.t);
    const int before = d.figures.prefill.planned() + d.figures.decode.planned();
    const int after = d.decision.prefill + d.decision.decode;
    max_prefill[phase] = std::max(max_prefill[phase], d.decision.prefill);
    max_decode[phase] = std::max(max_decode[phase], d.decision.decode);
    const int dir = (after > before) - (after < before);
    if (dir != 0) {
      if (last_direction[phase] != 0 && last_direction[phase] != dir) ++changes[phase];
      last_direction[phase] = dir;
    }
    final_prefill = d.decision.prefill;
    final_decode = d.decision.decode;
  }
  CHECK(max_prefill["prefill-heavy"] == 2);
  CHECK(max_decode["decode-heavy"] == 2);
  CHECK(final_prefill == 1);
  CHECK(final_decode == 1);
  for (const auto& [phase, n] : changes) {
    INFO(phase);
    CHECK(n <= 1);
  }

  // Each decision is the planner's simulation on the figures the router
  // reported: the same figures, replayed through a planner with the same
  // options and worker model, give the same decisions (nothing in the live
  // path, the figures' JSON, the actuator's starting counts, changes them).
  placement::ModelSpec model = placement::LoadModelSpec(dir).value();
  auto latency = placement::LoadLatencyModel(profile, model, 1).value();
  placement::PlannerOptions po = o.planner;
  po.prefill.kv_capacity_tokens = po.decode.kv_capacity_tokens = WorkerKvCapacity(r->decisions.front().figures).value();
  po.max_instances = 3;
  po.max_prefill = po.max_decode = 2;
  placement::Planner replay(model, *latency, po);
  for (const LocalDecision& d : r->decisions) {
    const placement::ScaleDecision again =
        d.record.check ? replay.Check(d.figures).value_or(placement::ScaleDecision{}) : replay.Decide(d.figures);
    INFO(PhaseAt(phases, d.t) << " t=" << d.t << ": live " << d.record.Describe() << "\nreplayed " << replay.last().Describe());
    CHECK(again.prefill == d.decision.prefill);
    CHECK(again.decode == d.decision.decode);
    CHECK(replay.last().prefill_need == d.record.prefill_need);
    CHECK(replay.last().decode_need == d.record.decode_need);
    CHECK(replay.last().predicted_ttft_p50 == d.record.predicted_ttft_p50);
  }

  // The decode pool grew by a switch, and the workers drained away ended
  // by their drain.
  int switches = 0;
  for (const LocalDecision& d : r->decisions) {
    if (d.decision.to_decode > 0) CHECK(PhaseAt(phases, d.t) == "decode-heavy");
    switches += d.decision.to_decode + d.decision.to_prefill;
  }
  CHECK(switches >= 1);
  CHECK(all_lines.find("(prefill -> decode)") != std::string::npos);
  CHECK(r->retired.size() >= 1);
  for (const std::string& l : r->retired) CHECK(l.find("exited with code 0") != std::string::npos);
}

}  // namespace
}  // namespace duet::autoscale

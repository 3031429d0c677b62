// The SLA planner (planner.h) deciding from figures, and driving the
// simulator's autoscaled runs (SimulateAutoscaled): pools that follow a
// prefill-heavy, a decode-heavy and a quiet phase, no request lost on a
// drained or switched instance, cool-down and restarts, and the
// queue-threshold autoscaler it is compared with.
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/planner.h"
#include "placement/sim.h"

namespace duet::placement {
namespace {

constexpr char kFit[] = "placement/testdata/distserve-a100-80g.json";

ModelSpec Opt13b() { return ModelPreset("opt-13b").value(); }

struct Phase {
  double seconds, rate;
  int64_t prompt, output;
};

// Poisson arrivals, phase after phase.
std::vector<SimRequest> Phases(const std::vector<Phase>& phases, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SimRequest> out;
  double start = 0;
  for (const Phase& p : phases) {
    std::exponential_distribution<double> gap(p.rate);
    for (double t = start + gap(rng); t < start + p.seconds; t += gap(rng)) {
      out.push_back({.arrival = t, .prompt = p.prompt, .output = p.output});
    }
    start += p.seconds;
  }
  return out;
}

struct Setup {
  ModelSpec model = Opt13b();
  std::unique_ptr<LatencyModel> latency;
  InstanceSpec prefill, decode;
  Setup() {
    latency = LoadLatencyModel(kFit, model).value();
    const GpuSpec gpu = LoadGpu("a100-80g").value();
    for (auto [s, role] : {std::pair<InstanceSpec*, InstanceRole>{&prefill, InstanceRole::kPrefill},
                           {&decode, InstanceRole::kDecode}}) {
      s->role = role;
      s->kv_capacity_tokens = KvCapacity(model, gpu, s->par);
    }
  }
  ClusterSpec Cluster(int p, int d) const {
    ClusterSpec c;
    c.instances.assign(static_cast<size_t>(p), prefill);
    c.instances.insert(c.instances.end(), static_cast<size_t>(d), decode);
    return c;
  }
  PlannerOptions Options() const {
    return PlannerOptions{.slo = {.ttft = 0.5, .tpot = 0.1},
                          .prefill = prefill,
                          .decode = decode,
                          .min_prefill = 1,
                          .max_prefill = 8,
                          .min_decode = 1,
                          .max_decode = 8,
                          .max_window_requests = 400};
  }
};

// The planned instances of a pool at the last tick before `t`.
int At(const SimResult& r, double t, bool prefill) {
  int n = 0;
  for (const FleetSample& s : r.timeline) {
    if (s.t <= t) n = prefill ? s.prefill : s.decode;
  }
  return n;
}

// Direction changes of a pool's planned size over the ticks in [from, to).
int Reversals(const SimResult& r, double from, double to, bool prefill) {
  int last = 0, turns = 0, prev = -1;
  for (const FleetSample& s : r.timeline) {
    if (s.t < from || s.t >= to) continue;
    const int n = prefill ? s.prefill : s.decode;
    if (prev >= 0 && n != prev) {
      const int dir = n > prev ? 1 : -1;
      turns += last != 0 && dir != last;
      last = dir;
    }
    prev = n;
  }
  return turns;
}

const std::vector<Phase> kPhases = {
    {.seconds = 300, .rate = 2, .prompt = 512, .output = 64},     // quiet
    {.seconds = 600, .rate = 10, .prompt = 1800, .output = 4},    // prefill-heavy
    {.seconds = 600, .rate = 12, .prompt = 64, .output = 600},    // decode-heavy
    {.seconds = 900, .rate = 1, .prompt = 256, .output = 32},     // quiet
};

TEST_CASE("the planner grows prefill for long prompts, decode for long outputs, and shrinks when quiet",
          "[planner]") {
  Setup s;
  const std::vector<SimRequest> reqs = Phases(kPhases, 7);
  Planner planner(s.model, *s.latency, s.Options());
  const AutoscaleOptions a{.scaler = &planner, .prefill = s.prefill, .decode = s.decode, .startup_s = 60};
  const SimResult r = SimulateAutoscaled(s.Cluster(1, 1), s.model, *s.latency, reqs, a);

  // Nothing lost: every request ended, those on drained instances too.
  REQUIRE(r.drained > 0);
  for (const RequestOutcome& o : r.requests) REQUIRE(o.finish >= o.first_token);
  REQUIRE(r.requests.size() == reqs.size());

  const int p_quiet = At(r, 300, true), d_quiet = At(r, 300, false);
  const int p_prefill = At(r, 900, true), d_prefill = At(r, 900, false);
  const int p_decode = At(r, 1500, true), d_decode = At(r, 1500, false);
  const int p_end = At(r, 2400, true), d_end = At(r, 2400, false);
  INFO("quiet " << p_quiet << "/" << d_quiet << ", prefill-heavy " << p_prefill << "/" << d_prefill
                << ", decode-heavy " << p_decode << "/" << d_decode << ", quiet " << p_end << "/" << d_end);
  CHECK(p_prefill >= p_quiet + 2);   // long prompts: prefill grows
  CHECK(d_prefill <= d_quiet + 1);   // ... decode does not
  CHECK(d_decode >= d_prefill + 2);  // long outputs: decode grows
  CHECK(p_decode < p_prefill);       // ... and prefill gives back
  CHECK(p_end + d_end < p_decode + d_decode);
  CHECK(p_end <= 2);
  CHECK(d_end <= 2);
  // Each phase (with the transition into it) changes direction at most once per pool.
  double start = 0;
  for (const Phase& ph : kPhases) {
    INFO("phase from " << start << " s");
    CHECK(Reversals(r, start, start + ph.seconds, true) <= 1);
    CHECK(Reversals(r, start, start + ph.seconds, false) <= 1);
    start += ph.seconds;
  }
  // Fewer GPU-seconds than the largest pools held throughout.
  const SimResult fixed = Simulate(s.Cluster(p_prefill, d_decode), s.model, *s.latency, reqs);
  CHECK(r.gpu_seconds < 0.8 * fixed.gpu_seconds);
  // The SLOs kept far better than by the smallest pools.
  const double least = Simulate(s.Cluster(1, 1), s.model, *s.latency, reqs).Attainment(s.Options().slo);
  INFO("attainment " << r.Attainment(s.Options().slo) << ", 1 + 1 instances: " << least);
  CHECK(r.Attainment(s.Options().slo) >= 0.85);
  CHECK(r.Attainment(s.Options().slo) >= least + 0.2);

  SECTION("the same run decides the same") {
    Planner again(s.model, *s.latency, s.Options());
    AutoscaleOptions b = a;
    b.scaler = &again;
    const SimResult r2 = SimulateAutoscaled(s.Cluster(1, 1), s.model, *s.latency, reqs, b);
    REQUIRE(r2.timeline.size() == r.timeline.size());
    for (size_t i = 0; i < r.timeline.size(); ++i) {
      CHECK(r2.timeline[i].prefill == r.timeline[i].prefill);
      CHECK(r2.timeline[i].decode == r.timeline[i].decode);
    }
  }
}

TEST_CASE("with flex instances the planner switches roles instead of draining and starting, losing nothing",
          "[planner]") {
  Setup s;
  const std::vector<SimRequest> reqs = Phases(kPhases, 11);
  PlannerOptions o = s.Options();
  o.switch_roles = true;
  o.max_instances = 8;
  Planner planner(s.model, *s.latency, o);
  const AutoscaleOptions a{.scaler = &planner, .prefill = s.prefill, .decode = s.decode, .startup_s = 60};
  const SimResult r = SimulateAutoscaled(s.Cluster(1, 1), s.model, *s.latency, reqs, a);
  CHECK(r.switched > 0);
  for (const RequestOutcome& o2 : r.requests) REQUIRE(o2.finish >= o2.first_token);
  for (const FleetSample& x : r.timeline) CHECK(x.prefill + x.decode <= 8);
}

// Figures of a span: its arrivals and the pools (no lengths).
LoadFigures Span(double now, double interval_s, int64_t arrivals, int prefill, int decode) {
  LoadFigures f;
  f.now = now;
  f.interval_s = interval_s;
  f.arrivals = arrivals;
  f.prefill.ready = prefill;
  f.decode.ready = decode;
  return f;
}

// A 30 s interval at `rate`, every request 512 + 64 tokens.
LoadFigures Steady(double now, double rate, int prefill, int decode) {
  LoadFigures f = Span(now, 30, static_cast<int64_t>(rate * 30), prefill, decode);
  f.prompt_lens.assign(static_cast<size_t>(f.arrivals), 512);
  f.output_lens.assign(static_cast<size_t>(f.arrivals), 64);
  return f;
}

TEST_CASE("the planner shrinks only after its cool-down, from what a restart finds, and grows at once",
          "[planner]") {
  Setup s;
  PlannerOptions o = s.Options();
  o.cooldown_s = 120;
  Planner planner(s.model, *s.latency, o);
  // A restarted planner finds 6 + 6 under a light load: it keeps them for a cool-down.
  int p = 6, d = 6;
  double t = 1000;
  for (; t < 1000 + 120; t += 30) {
    const ScaleDecision x = planner.Decide(Steady(t, 1, p, d));
    INFO("t " << t << ": " << planner.last().Describe());
    CHECK(x.prefill == 6);
    CHECK(x.decode == 6);
  }
  const ScaleDecision down = planner.Decide(Steady(t, 1, p, d));
  INFO(planner.last().Describe());
  CHECK(down.prefill < 6);
  CHECK(down.decode < 6);
  p = down.prefill;
  d = down.decode;
  // Forty times the load: more at once, no cool-down.
  const ScaleDecision up = planner.Decide(Steady(t + 30, 40, p, d));
  INFO(planner.last().Describe());
  CHECK(up.prefill > p);
  CHECK(up.decode > d);
  CHECK(planner.last().simulations > 0);
  CHECK(planner.last().predicted_ttft_p50 > 0);

  // The figures' clock goes back (the router restarted, its age from 0):
  // the planner keeps the grown pools a cool-down in the new clock, then
  // shrinks them (spans kept in the old clock would hold them for as long
  // as the old router had run).
  p = up.prefill;
  d = up.decode;
  double r = 10;
  for (; r < 10 + 120; r += 30) {
    const ScaleDecision x = planner.Decide(Steady(r, 1, p, d));
    INFO("restarted router, t " << r << ": " << planner.last().Describe());
    CHECK(x.prefill == p);
    CHECK(x.decode == d);
  }
  const ScaleDecision after = planner.Decide(Steady(r, 1, p, d));
  INFO(planner.last().Describe());
  CHECK(after.prefill < p);
  CHECK(after.decode < d);
}

// The 5 s a burst check reads.
LoadFigures Recent(double now, int64_t arrivals, int prefill, int decode) { return Span(now, 5, arrivals, prefill, decode); }

TEST_CASE("a burst check between intervals grows the pools at once, as a decision at the burst's rate would",
          "[planner]") {
  Setup s;
  Planner planner(s.model, *s.latency, s.Options());
  CHECK(!planner.Check(Recent(5, 500, 1, 1)).has_value());  // before a decision: nothing to compare with
  const ScaleDecision base = planner.Decide(Steady(30, 4, 1, 1));
  const int p = base.prefill, d = base.decode;
  // Sized for 4.2 req/s: 21 arrivals in 5 s expected, 35 is within three
  // standard deviations; 200 is a burst.
  CHECK(!planner.Check(Recent(35, 35, p, d)).has_value());
  CHECK(!planner.last().check);
  const std::optional<ScaleDecision> burst = planner.Check(Recent(40, 200, p, d));
  REQUIRE(burst.has_value());
  INFO(planner.last().Describe());
  CHECK(planner.last().check);
  CHECK(burst->prefill > p);
  CHECK(burst->decode > d);
  // The sizes a first decision at 40 req/s gives.
  Planner fresh(s.model, *s.latency, s.Options());
  const ScaleDecision at40 = fresh.Decide(Steady(30, 40, 1, 1));
  CHECK(burst->prefill == at40.prefill);
  CHECK(burst->decode == at40.decode);
  // The same rate again is what the pools were sized for; and the grown
  // pools wait a cool-down before they shrink.
  CHECK(!planner.Check(Recent(45, 200, burst->prefill, burst->decode)).has_value());
  const ScaleDecision after = planner.Decide(Steady(60, 4, burst->prefill, burst->decode));
  CHECK(after.prefill == burst->prefill);
  CHECK(after.decode == burst->decode);
}

TEST_CASE("in the simulator, burst checks grow the pools within seconds of a burst and keep more of its SLOs",
          "[planner]") {
  Setup s;
  const std::vector<SimRequest> reqs = Phases({{.seconds = 600, .rate = 2, .prompt = 512, .output = 64},
                                               {.seconds = 240, .rate = 12, .prompt = 512, .output = 64},
                                               {.seconds = 300, .rate = 2, .prompt = 512, .output = 64}},
                                              5);
  auto run = [&](double check_s, double* first_growth) {
    PlannerOptions o = s.Options();
    o.on_decision = [&](const PlannerRecord& r, const LoadFigures&) {
      if (*first_growth < 0 && r.now > 600 &&
          (r.decision.prefill > r.prefill_before || r.decision.decode > r.decode_before)) {
        *first_growth = r.now;
      }
    };
    Planner planner(s.model, *s.latency, o);
    const AutoscaleOptions a{
        .scaler = &planner, .prefill = s.prefill, .decode = s.decode, .check_s = check_s, .startup_s = 60};
    return SimulateAutoscaled(s.Cluster(1, 1), s.model, *s.latency, reqs, a);
  };
  double with_first = -1, without_first = -1;
  const SimResult with = run(5, &with_first), without = run(0, &without_first);
  INFO("first growth " << with_first << " s with checks, " << without_first << " s without; attainment "
                       << with.Attainment(s.Options().slo) << " vs " << without.Attainment(s.Options().slo));
  CHECK(with_first > 600);
  CHECK(with_first <= 610);    // the second check into the burst at the latest
  CHECK(without_first >= 630); // the next interval
  CHECK(with.Attainment(s.Options().slo) > without.Attainment(s.Options().slo));
  for (const RequestOutcome& o : with.requests) REQUIRE(o.finish >= o.first_token);
}

TEST_CASE("the queue-threshold autoscaler follows HPA's formula, tolerance and stabilization", "[planner]") {
  QueueThresholdScaler q({.prefill_bound = 4, .decode_bound = 10, .max_prefill = 8, .max_decode = 16,
                          .stabilization_s = 300});
  LoadFigures f;
  f.now = 30;
  f.prefill = {.ready = 1, .waiting = 10};
  f.decode = {.ready = 2, .waiting = 5, .running = 40};
  ScaleDecision d = q.Decide(f);
  CHECK(d.prefill == 3);  // ceil(10 / 4)
  CHECK(d.decode == 5);   // ceil(45 / 10)
  // The queues empty: the largest recommendation of the last 300 s holds.
  f.now = 60;
  f.prefill = {.ready = 3, .waiting = 0};
  f.decode = {.ready = 5, .waiting = 0, .running = 0};
  d = q.Decide(f);
  CHECK(d.prefill == 3);
  CHECK(d.decode == 5);
  f.now = 400;
  d = q.Decide(f);
  CHECK(d.prefill == 1);
  CHECK(d.decode == 1);
  // Within 10% of the current size: no change.
  f.now = 430;
  f.decode = {.ready = 10, .waiting = 0, .running = 105};  // 11 wanted, 10% more
  CHECK(q.Decide(f).decode == 10);
}

}  // namespace
}  // namespace duet::placement

// The SLA planner: each interval, the fewest prefill and decode instances
// that the simulator says meet the SLOs on the next interval's load.
//
//   Planner p(model, latency, {.slo = {0.2, 0.1}, .prefill = shape_p, .decode = shape_d, ...});
//   ScaleDecision d = p.Decide(figures);     // figures: autoscale.h
//   LOG(INFO) << p.last().Describe();
//
// Each decision:
//   1. Forecast. The interval's arrival rate feeds Holt's linear smoothing
//      (level and trend); the rate planned for is the larger of the last
//      interval's and the smoothed forecast one interval ahead, so a burst
//      is planned for at once and a fall is believed only as the trend
//      follows it. Prompt and output lengths are the last intervals' (up to
//      `lengths_kept` of each, drawn independently).
//   2. Correct. The latency model is scaled per phase by the ratio of the
//      observed to the predicted TTFT and TPOT medians (predicted by
//      simulating the interval just observed again: its pools, its arrival
//      rate, its own prompt and output lengths, so that a shift in the
//      lengths is not read as an error of the model), damped (the
//      factor moves by ratio^damping each interval) and bounded, from
//      intervals whose pools had settled and whose medians were below
//      twice the SLO (past it they measure a queue, not service times).
//   3. Size. Each pool is simulated alone on a window of the forecast load
//      (Poisson arrivals at rate x (1 + margin), the pool's queued and
//      running requests at its start, served but not counted): prefill
//      against TTFT (the requests end at their first token), decode against
//      TPOT (prefill instant). The fewest instances whose attainment of the
//      window's arrivals reaches `target`, within the pool's min and max;
//      for decode, at least as many as keep up with the load in the long
//      run (its KV reservations and batch rows by Little's law), which a
//      window too short for a near-critical queue to build in would miss.
//   4. Hysteresis. More instances than planned: at once. Fewer: only if the
//      smaller pool meets the SLO at the load scaled by N / (N - 1) (N the
//      instances planned now), the pool has not changed for `cooldown_s`,
//      and to no fewer than any decision of the last `cooldown_s` needed
//      (HPA's stabilization window). Past a total bound (`max_instances`),
//      the bound is split in proportion to what each pool needs to break
//      even (prefill at 90% attainment, decode at its long-run bound; a
//      halfway split to the pool short of its need). At the bound, a move
//      between the pools waits for the shrinking one's cool-down and is of
//      at least 1/16 of it.
//   Between intervals (Check), a burst scales up at once: when the
//      arrivals of the last few seconds exceed what the pools were sized
//      for (the planned rate with its margin) by more than Poisson noise
//      (three standard deviations), each pool grows to what that rate
//      needs (step 3, no forecast, no correction, growth only); a pool that
//      grew this way then waits a cool-down before it shrinks.
//   5. Switch. With `switch_roles` (both shapes alike), a pool that shrinks
//      while the other grows gives it instances by switching their role
//      instead of a drain and a start.
// The planner keeps no state a restart needs: pool sizes come from the
// figures, the forecast starts again from the last interval.
#ifndef DUET_PLACEMENT_PLANNER_H_
#define DUET_PLACEMENT_PLANNER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "placement/autoscale.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"

namespace duet::placement {

struct PlannerRecord;

struct PlannerOptions {
  Slo slo;
  double target = 0.995;  // attainment each pool must reach in its simulation
  double margin = 0.05;   // load headroom
  InstanceSpec prefill, decode;  // a new instance of each role (their roles are set)
  int min_prefill = 1, max_prefill = 8;
  int min_decode = 1, max_decode = 8;
  int max_instances = 0;  // prefill + decode; 0: the pools' maxima only
  double cooldown_s = 120;
  double window_s = 60;   // the simulated span of forecast load
  int64_t max_window_requests = 8000;  // a shorter window at high rates
  size_t lengths_kept = 16384;
  int64_t default_output = 128;  // until a request has finished
  double trend_alpha = 0.5, trend_beta = 0.3;
  double correction_damping = 0.25, correction_limit = 1.5;
  double decode_utilization = 0.85;  // of the decode pool's long-run capacity (KV and rows) at the planned load
  std::string forecast = "trend";  // trend | last
  bool switch_roles = false;
  // The cluster the pools run in (KV link, dispatch policy, prefix cache).
  ClusterSpec cluster;
  uint64_t seed = 1;
  // Called after each decision with its record and the figures it read
  // (the commands' logs).
  std::function<void(const PlannerRecord&, const LoadFigures&)> on_decision;
};

// One decision's inputs and reasoning, for the log and the metrics.
struct PlannerRecord {
  double now = 0;
  double observed_rate = 0, forecast_rate = 0, planned_rate = 0;
  int prefill_before = 0, decode_before = 0;
  int prefill_need = 0, decode_need = 0;  // what the load needs now (before hysteresis)
  int decode_stable = 0;                  // of which the decode pool's long-run bound
  ScaleDecision decision;
  double predicted_ttft_p50 = -1, predicted_tpot_p50 = -1;  // for the decision's pools at the forecast load
  double observed_ttft_p50 = -1, observed_tpot_p50 = -1;
  double correction_prefill = 1, correction_decode = 1;
  int simulations = 0;
  bool check = false;  // a check between intervals (a burst), not an interval's decision
  std::string Describe() const;
};

class Planner : public Autoscaler {
 public:
  // `latency` must outlive the planner.
  Planner(const ModelSpec& model, LatencyModel& latency, PlannerOptions options);
  ScaleDecision Decide(const LoadFigures& figures) override;
  std::optional<ScaleDecision> Check(const LoadFigures& recent) override;
  const PlannerRecord& last() const { return record_; }
  const PlannerOptions& options() const { return o_; }

 private:
  ScaleDecision Size(const LoadFigures& f);  // Decide, before on_decision
  struct Window {
    std::vector<SimRequest> requests;
    int64_t backlog = 0;  // requests at time 0 (not counted in the window's rate)
  };
  Window MakeWindow(double rate, int64_t backlog);  // lengths from those kept
  Window MakeWindow(double rate, int64_t backlog, const std::deque<int64_t>& prompts,
                    const std::deque<int64_t>& outputs);
  // Whether `n` instances of the role meet its SLO on `w`; the simulated
  // median TTFT or TPOT in `median`.
  // `target` 0: the options' target.
  bool Meets(InstanceRole role, int n, const Window& w, double* median, double target = 0);
  double Attainment(InstanceRole role, int n, const Window& w, double* median);
  // The decode instances whose KV and batch rows keep up with `rate` in the
  // long run (Little's law on the kept lengths): the bound a window too
  // short for a near-critical queue to grow in does not see.
  int DecodeStable(double rate);
  double DecodeLoad(double rate);  // the same at utilization 1, in (fractional) instances
  // The fewest instances in [lo, hi] meeting on `w` (hi when none does).
  int Fewest(InstanceRole role, int lo, int hi, const Window& w, double target = 0);
  // `need` recorded at `now` in `needs`; the largest need of the last cool-down.
  int RecentMost(std::deque<std::pair<double, int>>& needs, double now, int need) const;

  ModelSpec model_;
  LatencyModel& base_;
  std::unique_ptr<LatencyModel> corrected_;
  PlannerOptions o_;
  std::mt19937_64 rng_;
  std::deque<int64_t> prompts_, outputs_;
  std::vector<int64_t> ctx_;
  bool have_level_ = false;
  double level_ = 0, trend_ = 0;
  double sized_rate_ = 0;  // the rate (margin included) the pools were last sized for
  double correction_prefill_ = 1, correction_decode_ = 1;
  double last_change_prefill_ = -1e300, last_change_decode_ = -1e300;
  double last_now_ = -1e300;  // the last figures' clock
  int last_prefill_ = -1, last_decode_ = -1;
  std::deque<std::pair<double, int>> prefill_needs_, decode_needs_;  // (time, need) over the last cool-down
  PlannerRecord record_;
};

// The queue-threshold autoscaler KEDA and HPA setups run, for comparison:
// per pool, desired = ceil(its requests / bound) (prefill: queued prompts;
// decode: requests running or waiting, as a decode pool's queue is its
// batch), no change within 10% of the current size (HPA's tolerance),
// scale-up at once, scale-down to the largest desired of the last
// `stabilization_s` (HPA's default window: 300 s).
struct QueueThresholdOptions {
  double prefill_bound = 4;  // queued prompts per prefill instance
  double decode_bound = 64;  // requests per decode instance
  int min_prefill = 1, max_prefill = 8;
  int min_decode = 1, max_decode = 8;
  int max_instances = 0;  // prefill + decode; 0: the pools' maxima only
  double stabilization_s = 300;
  double tolerance = 0.1;
};

class QueueThresholdScaler : public Autoscaler {
 public:
  explicit QueueThresholdScaler(QueueThresholdOptions o) : o_(o) {}
  ScaleDecision Decide(const LoadFigures& figures) override;

 private:
  int Pool(double load, int current, double bound, int lo, int hi, std::deque<std::pair<double, int>>& history,
           double now) const;
  QueueThresholdOptions o_;
  std::deque<std::pair<double, int>> prefill_history_, decode_history_;
};

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_PLANNER_H_

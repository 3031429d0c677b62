// The live loop of `duet planner` and `duet up --autoscale`: every interval
// it reads the router's figures (GET /figures over the last interval), lets
// the actuator add what only it knows, asks the autoscaler (the SLA
// planner) for the pools' sizes, has the actuator bring them about, and
// logs and exports the decision (duet_planner_* metrics).
//
//   LivePlanner live(planner, actuator, {.figures = RouterFigures(router, absl::Seconds(30))});
//   while (!stop) { live.Step(); sleep(30 s); }    // or live.Run(should_stop)
//
// The loop keeps no state of its own: the pools come from the router and
// the actuator each time, so a planner restarted mid-run carries on.
#ifndef DUET_AUTOSCALE_LIVE_PLANNER_H_
#define DUET_AUTOSCALE_LIVE_PLANNER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "autoscale/actuator.h"
#include "base/metrics.h"
#include "http/client.h"
#include "placement/autoscale.h"
#include "placement/planner.h"

namespace duet::autoscale {

using FiguresSource = std::function<absl::StatusOr<placement::LoadFigures>()>;

// The router's GET /figures?window_s=... (router/load_recorder.h).
FiguresSource RouterFigures(http::Endpoint router, absl::Duration window);
// One worker's KV capacity in tokens as the router reports its decode
// workers (their blocks times their size, at the KV dtype they run), from
// its figures or asked afresh; Unavailable when it lists none.
absl::StatusOr<double> WorkerKvCapacity(const placement::LoadFigures& f);
absl::StatusOr<double> WorkerKvCapacity(const http::Endpoint& router);

struct LivePlannerOptions {
  FiguresSource figures;
  // The last `check`'s figures, read every `check` between intervals for
  // the autoscaler's burst check (none: no checks).
  FiguresSource recent;
  absl::Duration interval = absl::Seconds(30);
  absl::Duration check = absl::Seconds(5);
  std::function<void(const std::string&)> log;  // one line per decision (and per error)
};

class LivePlanner {
 public:
  // `scaler` and `actuator` must outlive the loop. An SLA planner's record
  // (forecast, predicted and observed latencies) is logged and exported.
  LivePlanner(placement::Autoscaler& scaler, Actuator& actuator, LivePlannerOptions options);
  // One decision: read, complete, decide, apply. An error (the router or
  // the API server unreachable) changes nothing and is counted.
  absl::Status Step();
  // Between intervals: the autoscaler's check on the recent figures, applied
  // when it decides (a burst). Whether it did; an error changes nothing
  // (the interval's Step reports an unreachable router).
  bool Check();
  // Steps every interval and checks every `check` until `should_stop`
  // (polled each 100 ms).
  void Run(const std::function<bool()>& should_stop);
  const placement::ScaleDecision& last() const { return last_; }
  const placement::LoadFigures& figures() const { return figures_; }

 private:
  void Export(const placement::LoadFigures& f, const placement::ScaleDecision& d);

  placement::Autoscaler& scaler_;
  placement::Planner* planner_;  // scaler_, when it is the SLA planner
  Actuator& actuator_;
  LivePlannerOptions o_;
  placement::ScaleDecision last_;
  placement::LoadFigures figures_;
  Counter *up_, *down_, *hold_, *errors_;
};

}  // namespace duet::autoscale

#endif  // DUET_AUTOSCALE_LIVE_PLANNER_H_

// A local cluster of duet processes under phases of load, its pools fixed or
// resized by the SLA planner (LocalAutoscaler, what duet up --autoscale
// runs): the run loop //autoscale:local_run_test and
// //tools/bench:autoscale_local share. The caller drives the load (its own
// client, on its own thread); the loop supervises the cluster (retired
// workers reaped), counts worker-seconds and, autoscaling, decides every
// interval.
//
//   auto arrivals = PhaseArrivals({{"prefill-heavy", 25, 6, 900, 4}, ...}, 1);
//   ASSIGN_OR_RETURN(LocalRunResult r, RunLocal(o, [&](int port) { /* send arrivals */ }));
#ifndef DUET_AUTOSCALE_LOCAL_RUN_H_
#define DUET_AUTOSCALE_LOCAL_RUN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/autoscale.h"
#include "placement/planner.h"

namespace duet::autoscale {

// `seconds` of Poisson arrivals at `rate`, each of `prompt` tokens asking
// for `output` tokens.
struct LocalPhase {
  std::string name;
  double seconds = 0, rate = 0;
  int64_t prompt = 0, output = 0;
};
struct LocalArrival {
  double t = 0;  // seconds from the start of the load
  int64_t prompt = 0, output = 0;
};
std::vector<LocalArrival> PhaseArrivals(const std::vector<LocalPhase>& phases, uint64_t seed);
// The phase at time t (the last one past the end).
const std::string& PhaseAt(const std::vector<LocalPhase>& phases, double t);
double PhasesSeconds(const std::vector<LocalPhase>& phases);

struct LocalRunOptions {
  std::string model_dir, run_dir;
  int prefill = 1, decode = 1;  // fixed sizes, or the start when autoscaling
  bool autoscale = false;
  placement::PlannerOptions planner;  // with autoscale: SLOs, bounds, cool-down; switch_roles: flex workers
  std::string latency_file;           // with autoscale: `duet profile --threads 1` of this machine
  int max_workers = 3;
  double interval_s = 5;
  double kv_gib = 0.25;
  double seconds = 0;  // the loop runs at least this long (and until the load returns)
  std::function<void(const std::string&)> log;
};

struct LocalDecision {
  double t = 0;  // seconds from the start of the load
  placement::LoadFigures figures;  // as the planner saw them
  placement::ScaleDecision decision;
  placement::PlannerRecord record;
};

struct LocalRunResult {
  std::vector<LocalDecision> decisions;
  double worker_seconds = 0;         // worker processes alive (starting and draining included), integrated
  std::vector<std::string> retired;  // "<id> (pid N) drained and exited with code 0 (retired)"
};

// Starts the cluster (a router, then the workers, one engine thread each),
// then runs `load(http_port)` on its own thread.
absl::StatusOr<LocalRunResult> RunLocal(const LocalRunOptions& o, const std::function<void(int http_port)>& load);

}  // namespace duet::autoscale

#endif  // DUET_AUTOSCALE_LOCAL_RUN_H_

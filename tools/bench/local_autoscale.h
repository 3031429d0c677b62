// A local cluster of duet processes under phases of load, its pools fixed or
// resized by the SLA planner (autoscale/local_actuator.h, what duet up
// --autoscale runs), for //tools/bench:autoscale_local and
// //tests:autoscale_local_test.
//
//   LocalRunOptions o{.model_dir = dir, .phases = {{"prefill-heavy", 20, 5, 900, 4}, ...}, .autoscale = true};
//   ASSIGN_OR_RETURN(LocalRunResult r, RunLocal(o));
//   Summarize(r.run, slo.ttft, slo.tpot).slo_attainment, r.worker_seconds, r.decisions
#ifndef DUET_TOOLS_BENCH_LOCAL_AUTOSCALE_H_
#define DUET_TOOLS_BENCH_LOCAL_AUTOSCALE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/autoscale.h"
#include "placement/planner.h"
#include "tools/bench/serve_common.h"

namespace duet::bench {

// `seconds` of Poisson arrivals at `rate`, each `prompt` random tokens and
// `output` tokens long (ignore_eos).
struct LocalPhase {
  std::string name;
  double seconds = 0, rate = 0;
  int64_t prompt = 0, output = 0;
};
std::vector<BenchRequest> PhaseRequests(const std::vector<LocalPhase>& phases, int64_t vocab, uint32_t seed);

struct LocalRunOptions {
  std::string model_dir, model_name, run_dir;
  std::vector<LocalPhase> phases;
  int prefill = 1, decode = 1;  // fixed sizes, or the start when autoscaling
  bool autoscale = false;
  placement::PlannerOptions planner;  // with autoscale: SLOs, bounds, cool-down
  std::string latency_file;           // with autoscale: `duet profile --threads 1` of this machine
  int max_workers = 3;
  double interval_s = 5;
  double kv_gib = 0.25;
  int64_t vocab = 1000;
  uint32_t seed = 1;
  std::function<void(const std::string&)> log;
};

struct LocalDecision {
  double t = 0;  // seconds from the first arrival
  std::string phase;
  placement::LoadFigures figures;  // as the planner saw them
  placement::ScaleDecision decision;
  placement::PlannerRecord record;
};

struct LocalRunResult {
  RunResult run;
  std::vector<LocalDecision> decisions;
  double worker_seconds = 0;     // worker processes alive (starting and draining included), integrated
  std::vector<std::string> retired;  // "<id> ... drained and exited with code 0 (retired)" lines
};

absl::StatusOr<LocalRunResult> RunLocal(const LocalRunOptions& o);

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_LOCAL_AUTOSCALE_H_

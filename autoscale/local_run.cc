#include "autoscale/local_run.h"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "autoscale/local_actuator.h"
#include "base/status_macros.h"
#include "cluster/local_cluster.h"

namespace duet::autoscale {

std::vector<LocalArrival> PhaseArrivals(const std::vector<LocalPhase>& phases, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<LocalArrival> out;
  double start = 0;
  for (const LocalPhase& p : phases) {
    if (p.rate > 0) {
      std::exponential_distribution<double> gap(p.rate);
      for (double t = start + gap(rng); t < start + p.seconds; t += gap(rng)) out.push_back({t, p.prompt, p.output});
    }
    start += p.seconds;
  }
  return out;
}

const std::string& PhaseAt(const std::vector<LocalPhase>& phases, double t) {
  double end = 0;
  for (const LocalPhase& p : phases) {
    end += p.seconds;
    if (t < end) return p.name;
  }
  return phases.back().name;
}

double PhasesSeconds(const std::vector<LocalPhase>& phases) {
  double s = 0;
  for (const LocalPhase& p : phases) s += p.seconds;
  return s;
}

absl::StatusOr<LocalRunResult> RunLocal(const LocalRunOptions& o, const std::function<void(int http_port)>& load) {
  auto log = o.log ? o.log : [](const std::string&) {};
  cluster::ClusterOptions co;
  co.model_dir = o.model_dir;
  co.run_dir = o.run_dir;
  co.router_args = {"--heartbeat-ms", "200"};
  co.worker_args = {"--kv-memory", absl::StrCat(o.kv_gib), "--heartbeat-ms", "200"};
  cluster::LocalCluster c(co);
  RETURN_IF_ERROR(c.StartRouter());
  std::vector<cluster::WorkerSpec> workers;
  for (int i = 0; i < o.prefill + o.decode; ++i) {
    workers.push_back({.role = i < o.prefill ? "prefill" : "decode", .flex = o.autoscale && o.planner.switch_roles});
  }
  RETURN_IF_ERROR(c.StartWorkers(std::move(workers)));
  std::unique_ptr<LocalAutoscaler> scaler;
  if (o.autoscale) {
    ASSIGN_OR_RETURN(scaler, LocalAutoscaler::Start(c, {.planner = o.planner,
                                                        .model_dir = o.model_dir,
                                                        .latency_file = o.latency_file,
                                                        .max_workers = o.max_workers,
                                                        .interval = absl::Seconds(o.interval_s),
                                                        .log = log}));
  }
  LocalRunResult out;
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::atomic<bool> loaded{false};
  std::thread driver([&] {
    load(c.http_port());
    loaded = true;
  });
  const auto supervise_log = [&](const std::string& line) {
    log(line);
    if (absl::StrContains(line, "(retired)")) out.retired.push_back(line);
  };
  auto last = t0;
  // Until the span is over and the load has ended: supervise (retired
  // workers reaped), count worker-seconds, decide each interval.
  for (;;) {
    c.Supervise(supervise_log);
    const auto now = std::chrono::steady_clock::now();
    out.worker_seconds += static_cast<double>(c.worker_ids().size()) * std::chrono::duration<double>(now - last).count();
    last = now;
    if (scaler && scaler->Poll()) {
      out.decisions.push_back({.t = since(),
                               .figures = scaler->live().figures(),
                               .decision = scaler->live().last(),
                               .record = scaler->planner().last()});
    }
    if (since() >= o.seconds && loaded) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the supervision tick
  }
  driver.join();
  return out;
}

}  // namespace duet::autoscale

#include "tools/bench/local_autoscale.h"

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "autoscale/local_actuator.h"
#include "base/status_macros.h"

namespace duet::bench {

std::vector<BenchRequest> PhaseRequests(const std::vector<LocalPhase>& phases, int64_t vocab, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(10, static_cast<int32_t>(vocab) - 1);
  std::vector<BenchRequest> out;
  double start = 0;
  for (const LocalPhase& p : phases) {
    if (p.rate > 0) {
      std::exponential_distribution<double> gap(p.rate);
      for (double t = start + gap(rng); t < start + p.seconds; t += gap(rng)) {
        BenchRequest r{.arrival_s = t, .max_tokens = p.output};
        for (int64_t k = 0; k < p.prompt; ++k) r.prompt.push_back(token(rng));
        out.push_back(std::move(r));
      }
    }
    start += p.seconds;
  }
  return out;
}

absl::StatusOr<LocalRunResult> RunLocal(const LocalRunOptions& o) {
  auto log = o.log ? o.log : [](const std::string&) {};
  std::vector<cluster::WorkerSpec> workers;
  for (int i = 0; i < o.prefill + o.decode; ++i) workers.push_back({.role = i < o.prefill ? "prefill" : "decode"});
  ASSIGN_OR_RETURN(auto c, StartCluster(o.run_dir, o.model_dir, workers, o.kv_gib, /*heartbeat_ms=*/200));
  std::unique_ptr<autoscale::LocalAutoscaler> scaler;
  if (o.autoscale) {
    ASSIGN_OR_RETURN(scaler, autoscale::LocalAutoscaler::Start(*c, {.planner = o.planner,
                                                                   .model_dir = o.model_dir,
                                                                   .latency_file = o.latency_file,
                                                                   .max_workers = o.max_workers,
                                                                   .interval = absl::Seconds(o.interval_s),
                                                                   .log = log}));
  }
  const std::vector<BenchRequest> reqs = PhaseRequests(o.phases, o.vocab, o.seed);
  double total = 0;
  for (const LocalPhase& p : o.phases) total += p.seconds;
  LocalRunResult out;
  std::atomic<bool> replayed{false};
  std::thread replay([&] {
    out.run = Replay(c->http_port(), o.model_name, reqs, 600);
    replayed = true;
  });
  // Replay's clock starts 200 ms from now (its threads start first).
  const auto t0 = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto phase_at = [&](double t) {
    double end = 0;
    for (const LocalPhase& p : o.phases) {
      end += p.seconds;
      if (t < end) return p.name;
    }
    return o.phases.back().name;
  };
  auto last = std::chrono::steady_clock::now();
  const auto supervise_log = [&](const std::string& line) {
    log(line);
    if (absl::StrContains(line, "(retired)")) out.retired.push_back(line);
  };
  // Until the phases are over and every request has ended: supervise (the
  // retired workers reaped), count worker-seconds, decide each interval.
  for (;;) {
    c->Supervise(supervise_log);
    const auto now = std::chrono::steady_clock::now();
    out.worker_seconds += static_cast<double>(c->worker_ids().size()) * std::chrono::duration<double>(now - last).count();
    last = now;
    if (scaler && scaler->Poll()) {
      const autoscale::LivePlanner& live = scaler->live();
      out.decisions.push_back({.t = since(),
                               .phase = phase_at(since()),
                               .figures = live.figures(),
                               .decision = live.last(),
                               .record = scaler->planner().last()});
    }
    if (since() >= total && replayed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the supervision tick
  }
  replay.join();
  return out;
}

}  // namespace duet::bench

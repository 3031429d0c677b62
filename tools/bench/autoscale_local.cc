// The SLA planner on real processes (duet up --autoscale's planner and local
// actuator): three phases of load, prefill-heavy (long prompts, short
// outputs), decode-heavy (short prompts, long outputs) and quiet, replayed
// open-loop against the tiny model's cluster on this machine, resized by
// the planner within three one-thread workers (`--cores 4 --max-workers 4`:
// the router and the planner take a core), once with drains and starts and
// once with flex workers it switches between the pools (--switch-roles),
// beside the same load on fixed clusters: the minimal (1 prefill + 1
// decode) and both maximal ones (2 + 1, 1 + 2). Prints SLO attainment (TTFT
// and TPOT at the client, from the SSE events) and worker-seconds for each,
// and the planner's decisions.
//
//   bazel run -c opt //tools/bench:autoscale_local [-- --slo-ttft 1 --slo-tpot 0.005]
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "engine/testing/model_maker.h"
#include "autoscale/local_actuator.h"
#include "autoscale/local_run.h"
#include "tools/bench/serve_common.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;

absl::Status Run(const FlagSet& f) {
  SetProgressName("autoscale_local");
  std::string model_dir = f.GetString("model");
  if (model_dir.empty()) {
    ASSIGN_OR_RETURN(model_dir, testing::EnsureCachedModel("tiny", "llama"));
  }
  const fs::path tmp = fs::temp_directory_path() / absl::StrCat("duet-autoscale-local-", getpid());
  fs::create_directories(tmp);
  const std::string duet = fs::absolute("tools/duet").string();
  std::string profile = f.GetString("profile");
  if (profile.empty()) {
    profile = (tmp / "worker-profile.json").string();
    Progress("timing one worker (duet profile --threads 1)");
    RETURN_IF_ERROR(autoscale::ProfileWorker(duet, model_dir, profile, (tmp / "profile.log").string()));
  }
  autoscale::LocalRunOptions o;
  o.model_dir = model_dir;
  const std::string model_name = fs::path(model_dir).filename().string();
  o.latency_file = profile;
  o.max_workers = 3;
  o.interval_s = f.GetDouble("interval");
  o.planner.slo = {.ttft = f.GetDouble("slo-ttft"), .tpot = f.GetDouble("slo-tpot")};
  o.planner.cooldown_s = f.GetDouble("cooldown");
  const double s = f.GetDouble("phase-seconds");
  const std::vector<autoscale::LocalPhase> phases = {{"prefill-heavy", s, f.GetDouble("prefill-rate"), 900, 4},
                                                     {"decode-heavy", s, f.GetDouble("decode-rate"), 16, 400},
                                                     {"quiet", s * 1.4, 0.2, 16, 8}};
  o.seconds = autoscale::PhasesSeconds(phases);
  // The phases' arrivals as the serving benches' requests: random prompt
  // tokens, streamed, timed at the client.
  std::vector<BenchRequest> reqs;
  {
    std::mt19937_64 rng(static_cast<uint64_t>(f.GetInt("seed")));
    for (const autoscale::LocalArrival& a : autoscale::PhaseArrivals(phases, static_cast<uint64_t>(f.GetInt("seed")))) {
      BenchRequest r{.arrival_s = a.t, .max_tokens = a.output};
      for (int64_t k = 0; k < a.prompt; ++k) r.prompt.push_back(static_cast<int32_t>(10 + rng() % 900));
      reqs.push_back(std::move(r));
    }
  }
  struct Row {
    std::string name;
    int prefill, decode;
    bool autoscale, switches;
    Summary sum;
    double worker_seconds;
    std::vector<autoscale::LocalDecision> decisions;
  };
  std::vector<Row> rows = {{"SLA planner (from 1 + 1, up to 3)", 1, 1, true, false},
                           {"SLA planner, flex workers switched", 1, 1, true, true},
                           {"fixed minimal: 1 prefill + 1 decode", 1, 1, false, false},
                           {"fixed maximal: 2 prefill + 1 decode", 2, 1, false, false},
                           {"fixed maximal: 1 prefill + 2 decode", 1, 2, false, false}};
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& row = rows[i];
    Progress(absl::StrCat("run ", i + 1, " of ", rows.size(), ": ", row.name));
    o.autoscale = row.autoscale;
    o.planner.switch_roles = row.switches;
    o.prefill = row.prefill;
    o.decode = row.decode;
    o.run_dir = (tmp / absl::StrCat("run-", i)).string();
    o.log = row.autoscale ? [](const std::string& l) { Progress(l); } : std::function<void(const std::string&)>();
    RunResult run;
    ASSIGN_OR_RETURN(autoscale::LocalRunResult r,
                     autoscale::RunLocal(o, [&](int port) { run = Replay(port, model_name, reqs, 600); }));
    row.sum = Summarize(run, o.planner.slo.ttft, o.planner.slo.tpot);
    row.worker_seconds = r.worker_seconds;
    row.decisions = r.decisions;
  }
  std::printf("\nautoscale_local: tiny model, %s; phases %s; SLO TTFT %g s, TPOT %g s; interval %g s, cool-down %g s\n",
              model_dir.c_str(),
              absl::StrFormat("prefill-heavy %gs @ %g/s (900 + 4 tokens), decode-heavy %gs @ %g/s (16 + 400), "
                              "quiet %gs @ 0.2/s", s, phases[0].rate, s, phases[1].rate, s * 1.4)
                  .c_str(),
              o.planner.slo.ttft, o.planner.slo.tpot, o.interval_s, o.planner.cooldown_s);
  std::printf("%-40s %10s %10s %10s %10s %8s %10s\n", "cluster", "attain", "TTFT p90", "TPOT p90", "errors",
              "worker-s", "vs planner");
  const Row& planner = rows[0];
  for (const Row& row : rows) {
    std::printf("%-40s %9.2f%% %9.3fs %9.4fs %10lld %8.0f %9.2fx\n", row.name.c_str(), 100 * row.sum.slo_attainment,
                row.sum.ttft[1], row.sum.tpot[1], static_cast<long long>(row.sum.errors), row.worker_seconds,
                row.worker_seconds / planner.worker_seconds);
  }
  for (const Row& row : rows) {
    if (!row.autoscale) continue;
    std::printf("\n%s: the decisions (phase, time, pools before -> after, needs, switches):\n", row.name.c_str());
    for (const autoscale::LocalDecision& d : row.decisions) {
      if (d.decision.prefill == d.figures.prefill.planned() && d.decision.decode == d.figures.decode.planned()) continue;
      std::printf("  %-14s t=%5.1fs  prefill %d -> %d (needs %d), decode %d -> %d (needs %d)%s\n",
                  autoscale::PhaseAt(phases, d.t).c_str(), d.t, d.figures.prefill.planned(), d.decision.prefill,
                  d.record.prefill_need, d.figures.decode.planned(), d.decision.decode, d.record.decode_need,
                  d.decision.to_decode + d.decision.to_prefill > 0 ? ", by a switch" : "");
    }
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("autoscale_local",
                  "The SLA planner on real processes over prefill-heavy, decode-heavy and quiet phases, beside "
                  "fixed minimal and maximal clusters: SLO attainment and worker-seconds.");
  f.String("model", "", "model directory (default: the embedded tiny model)");
  f.String("profile", "", "a `duet profile --threads 1` fit to reuse (default: profiled first)");
  f.Double("slo-ttft", 1.0, "TTFT target, seconds");
  f.Double("slo-tpot", 0.005, "TPOT target, seconds");
  f.Double("interval", 5, "seconds between the planner's decisions");
  f.Double("cooldown", 15, "seconds a pool keeps its size before it may shrink");
  f.Double("phase-seconds", 25, "length of each heavy phase (the quiet one is 1.4 times it)");
  f.Double("prefill-rate", 6, "requests/s in the prefill-heavy phase");
  f.Double("decode-rate", 10, "requests/s in the decode-heavy phase");
  f.Int("seed", 1, "arrivals and prompts");
  return duet::RunWithFlags(f, argc, argv, duet::bench::Run);
}

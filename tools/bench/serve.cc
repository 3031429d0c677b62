// End-to-end serving benchmark: a slice of the Splitwise conversation trace
// replayed open-loop against two clusters started from the `duet` binary on
// this machine's cores, disaggregated (router + prefill on core 0 + decode on
// core 1) beside colocated (router + one worker on both cores), in one table
// (STYLE rule 9: the colocated cluster is the reference, measured in the same
// run). //tools/bench:sim_check runs the same clusters beside duet sim.
//
//   bazel run -c opt //tools/bench:serve -- --rate 1.0 [--requests 120 --length-scale 0.25]
//
// Token counts are scaled to fit the bench model (context 2048); prompts are
// random token ids (fixed seed); every request streams with ignore_eos and
// max_tokens = the scaled decode length. Arrival gaps keep the trace's own
// pattern, rescaled so the mean rate is --rate. Each request runs on its own
// thread from its arrival time (open loop), so a slow cluster does not slow
// the offered load. TTFT and TPOT are measured at the client from the SSE
// events: TTFT = first event carrying a token - send time; TPOT = (last token
// time - first token time) / (tokens - 1).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "tools/bench/serve_common.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;

absl::Status Run(const FlagSet& f) {
  const Clock::time_point bench_start = Clock::now();
  const double rate = f.GetDouble("rate");
  const double scale = f.GetDouble("length-scale");
  const int64_t n = f.GetInt("requests");
  const double timeout_s = f.GetDouble("timeout-s");
  if (rate <= 0 || scale <= 0 || n < 2 || timeout_s <= 0) {
    return absl::InvalidArgumentError("--rate, --length-scale and --timeout-s must be > 0, --requests >= 2");
  }
  ASSIGN_OR_RETURN(const BenchInputs in, LoadBenchInputs(f));
  const std::string& trace = in.trace;
  const std::string& model_dir = in.model_dir;
  const std::string& model_name = in.model_name;
  const std::vector<TraceRow>& rows = in.rows;
  const int64_t context = in.context, vocab = in.vocab;
  const std::vector<BenchRequest> reqs =
      MakeWorkload(rows, rate, scale, context, vocab, static_cast<uint32_t>(f.GetInt("seed")));
  std::vector<double> plen, olen;
  for (const BenchRequest& r : reqs) {
    plen.push_back(static_cast<double>(r.prompt.size()));
    olen.push_back(static_cast<double>(r.max_tokens));
  }
  double prompt_sum = 0, out_sum = 0;
  for (double v : plen) prompt_sum += v;
  for (double v : olen) out_sum += v;

  const double kv_gib = f.GetDouble("kv-memory");
  const int cores = 2;
  std::vector<Setup> setups = {
      {"disaggregated", {{.role = "prefill", .threads = 1, .cpus = {0}}, {.role = "decode", .threads = 1, .cpus = {1}}}},
      {"colocated", {{.role = "colocated", .threads = cores, .cpus = {0, 1}}}},
  };
  if (std::thread::hardware_concurrency() < static_cast<unsigned>(cores)) {
    return absl::FailedPreconditionError("this benchmark pins workers to cores 0 and 1; the machine has fewer");
  }
  const std::string run_root = absl::StrCat(fs::temp_directory_path().string(), "/duet-serve-bench-", getpid());

  double ttft_slo = f.GetDouble("ttft-slo"), tpot_slo = f.GetDouble("tpot-slo");
  std::string slo_note = "given";
  std::vector<Summary> summaries;
  std::vector<double> run_walls;
  std::vector<double> other_cores;  // Cores' worth of CPU other processes used during each run.
  for (const Setup& s : setups) {
    Progress(absl::StrCat(s.name, ": starting the cluster"));
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> c,
                     StartCluster(run_root + "/" + s.name, model_dir, s.workers, kv_gib, f.GetInt("heartbeat-ms")));
    cluster::LocalCluster& cluster = *c;
    // Warm-up: first-use costs (UCX endpoints, allocations) are not the load's.
    {
      BenchRequest w{0, std::vector<int32_t>(64, 7), 8};
      Outcome o = StreamCompletion(cluster.http_port(), CompletionBody(model_name, w), Clock::now(), timeout_s);
      if (!o.ok()) return absl::InternalError(absl::StrCat(s.name, ": warm-up request failed: ", o.error));
    }
    // The SLOs, unless given: a multiple of one request alone on the first
    // (disaggregated) cluster, at the slice's p90 prompt and median output.
    if (ttft_slo <= 0 || tpot_slo <= 0) {
      BenchRequest probe{0, std::vector<int32_t>(static_cast<size_t>(Percentile(plen, 0.9)), 11),
                         std::max<int64_t>(8, static_cast<int64_t>(Percentile(olen, 0.5)))};
      Outcome o = StreamCompletion(cluster.http_port(), CompletionBody(model_name, probe), Clock::now(), timeout_s);
      if (!o.ok()) return absl::InternalError(absl::StrCat(s.name, ": SLO probe failed: ", o.error));
      const double k = f.GetDouble("slo-scale");
      if (ttft_slo <= 0) ttft_slo = k * o.ttft();
      if (tpot_slo <= 0) tpot_slo = k * o.tpot();
      slo_note = absl::StrCat(k, "x one ", probe.prompt.size(), "-token prompt alone on ", s.name, " (TTFT ",
                              static_cast<int>(o.ttft() * 1e3), " ms, TPOT ",
                              static_cast<int>(o.tpot() * 1e3), " ms)");
    }
    Progress(absl::StrCat(s.name, ": replaying ", n, " requests at ", rate, " req/s (~",
                          static_cast<int>(reqs.back().arrival_s), " s of arrivals)"));
    const CpuTicks before = ReadCpuTicks(cluster.pids());
    RunResult r = Replay(cluster.http_port(), model_name, reqs, timeout_s);
    const CpuTicks after = ReadCpuTicks(cluster.pids());
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK)) * std::max(r.wall_s, 1e-3);
    other_cores.push_back(
        std::max<double>(0, (after.machine_busy - before.machine_busy) - (after.ours - before.ours)) / ticks);
    RETURN_IF_ERROR(cluster.CheckAlive());
    summaries.push_back(Summarize(r, ttft_slo, tpot_slo));
    run_walls.push_back(r.wall_s);
    Progress(absl::StrCat(s.name, ": done in ", static_cast<int>(r.wall_s), " s, ", summaries.back().errors,
                          " errors", summaries.back().errors ? " (first: " + summaries.back().first_error + ")" : ""));
  }
  const bool failed = summaries[0].errors + summaries[1].errors > 0;
  std::error_code ec;
  if (!failed) fs::remove_all(run_root, ec);

  std::printf("duet serve bench: %s, trace %s rows %lld..%lld\n", model_dir.c_str(), trace.c_str(),
              static_cast<long long>(f.GetInt("offset")), static_cast<long long>(f.GetInt("offset") + n - 1));
  std::printf("workload: %lld requests at %.2f req/s (trace gaps rescaled; %.0f s of arrivals), length scale %g: "
              "prompt mean %.0f p50 %.0f max %.0f tokens, output mean %.0f p50 %.0f max %.0f tokens\n",
              static_cast<long long>(n), rate, reqs.back().arrival_s, scale, prompt_sum / n, Percentile(plen, 0.5),
              Percentile(plen, 1.0), out_sum / n, Percentile(olen, 0.5), Percentile(olen, 1.0));
  std::printf("disaggregated: router + prefill (core 0, 1 thread) + decode (core 1, 1 thread); "
              "colocated: router + 1 worker (cores 0-1, %d threads); routers unpinned; heartbeat %lld ms\n",
              cores, static_cast<long long>(f.GetInt("heartbeat-ms")));
  std::printf("SLO: TTFT <= %.0f ms and TPOT <= %.0f ms (%s)\n\n", ttft_slo * 1e3, tpot_slo * 1e3,
              slo_note.c_str());
  const Summary& d = summaries[0];
  const Summary& c = summaries[1];
  std::printf("%-24s %14s %14s %8s\n", "figure", "disaggregated", "colocated (ref)", "ratio");
  auto row = [](const std::string& name, double a, double b, const char* fmt) {
    char x[32], y[32];
    std::snprintf(x, sizeof(x), fmt, a);
    std::snprintf(y, sizeof(y), fmt, b);
    std::printf("%-24s %14s %14s %8.2f\n", name.c_str(), x, y, b != 0 ? a / b : NAN);
  };
  const char* q[3] = {"p50", "p90", "p99"};
  for (int i = 0; i < 3; ++i) row(absl::StrCat("TTFT ", q[i], " ms"), d.ttft[i] * 1e3, c.ttft[i] * 1e3, "%.0f");
  for (int i = 0; i < 3; ++i) row(absl::StrCat("TPOT ", q[i], " ms"), d.tpot[i] * 1e3, c.tpot[i] * 1e3, "%.1f");
  row("SLO attainment", d.slo_attainment, c.slo_attainment, "%.2f");
  row("throughput req/s", d.req_per_s, c.req_per_s, "%.3f");
  row("throughput out tok/s", d.tok_per_s, c.tok_per_s, "%.1f");
  row("run wall s", run_walls[0], run_walls[1], "%.1f");
  std::printf("%-24s %14lld %14lld %8s\n", "errors", static_cast<long long>(d.errors),
              static_cast<long long>(c.errors), "-");
  for (size_t i = 0; i < summaries.size(); ++i) {
    if (summaries[i].errors > 0) {
      std::printf("first error (%s): %s\n", setups[i].name.c_str(), summaries[i].first_error.c_str());
    }
  }
  if (failed) std::printf("the processes' logs are kept in %s\n", run_root.c_str());
  std::printf("\nother processes on the machine used %.2f (disaggregated) and %.2f (colocated) cores' worth "
              "of CPU during the runs (of %d; above ~0.1 the figures are skewed)\n",
              other_cores[0], other_cores[1], cores);
  std::printf("total wall time %.1f s\n", Seconds(Clock::now() - bench_start));
  if (failed) return absl::InternalError("some requests failed");
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("serve",
                  "Replays a slice of the Splitwise conversation trace open-loop against a disaggregated\n"
                  "cluster (prefill on core 0, decode on core 1) and a colocated one (both cores), and\n"
                  "prints TTFT, TPOT, SLO attainment and throughput side by side.");
  f.Double("rate", 1.0, "mean arrival rate, requests/s (the trace's gaps, rescaled)");
  duet::bench::AddBenchFlags(f, 120);
  f.Double("ttft-slo", 0, "TTFT SLO in seconds (0: --slo-scale x one request alone)");
  f.Double("tpot-slo", 0, "TPOT SLO in seconds (0: --slo-scale x one request alone)");
  f.Double("slo-scale", 5, "SLOs measured from one request alone are this multiple of its latency");
  return duet::RunWithFlags(f, argc, argv, duet::bench::Run, "serve bench");
}

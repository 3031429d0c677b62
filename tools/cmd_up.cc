// duet up: a whole cluster on this machine, as child processes.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "autoscale/local_actuator.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "cluster/local_cluster.h"
#include "placement/cluster_config.h"
#include "tools/commands.h"
#include "tools/planner_flags.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {
namespace {

namespace fs = std::filesystem;

std::string SelfExe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "duet" : p.string();
}

volatile sig_atomic_t g_stop = 0;
void OnStop(int sig) { g_stop = sig; }

// The planner's model of one local worker: --latency, or `duet profile` of
// this machine with one thread (a worker's), written into the run folder.
absl::StatusOr<std::string> WorkerProfile(const FlagSet& f, const std::string& model_dir, const std::string& run_dir) {
  if (!f.GetString("latency").empty()) return f.GetString("latency");
  const std::string out = run_dir + "/worker-profile.json";
  std::fprintf(stderr,
               "duet up: timing one worker on this machine for the planner (duet profile --threads 1: seconds on "
               "the tiny model, minutes on a large one; --latency FILE reuses a fit; log in %s/profile.log)\n",
               run_dir.c_str());
  RETURN_IF_ERROR(autoscale::ProfileWorker(SelfExe(), model_dir, out, run_dir + "/profile.log"));
  return out;
}

}  // namespace

int RunUp(int argc, char** argv) {
  FlagSet f("duet up",
            "Starts a local cluster serving the OpenAI API: a router and N prefill + M decode\n"
            "workers (or K colocated workers) as child processes, on the embedded tiny model\n"
            "unless --model is given. Prints the endpoint and a curl example. A process that dies\n"
            "is restarted (with backoff, a line naming it and its exit status) while the others\n"
            "serve on; --no-supervise stops everything instead. Stops on Ctrl-C or SIGTERM.");
  f.Int("port", 8000, "HTTP port of the OpenAI API");
  f.String("host", "127.0.0.1", "address the API listens on");
  f.String("model", "", "Hugging Face model directory (default: the embedded tiny model)");
  f.String("served-model-name", "", "model name clients send (default: the directory's name)");
  f.Int("prefill", 1, "prefill workers");
  f.Int("decode", 1, "decode workers");
  f.Int("colocated", 0, "colocated workers (instead of prefill + decode)");
  f.String("config", "", "cluster file (JSON; see the README) instead of the counts above");
  f.Int("threads", 0, "engine threads per worker (0: cores / workers, at least 1)");
  f.Double("kv-memory", 0.25, "KV cache per worker in GiB");
  f.String("api-key", "", "require 'Authorization: Bearer KEY' on the API (also $DUET_API_KEY)");
  f.String("api-key-file", "", "read the API key from this file instead");
  f.String("run-dir", "", "folder for logs and ready files (default: a new one under /tmp)");
  f.Bool("no-supervise",
         "stop the whole cluster (showing the log) when a process dies, instead of restarting it");
  f.Bool("autoscale",
         "resize the prefill and decode pools to the load with the SLA planner (duet planner's, every --interval; "
         "needs --slo-ttft and --slo-tpot): workers of one thread each, started, and drained (their requests end "
         "or migrate), within --max-workers and --cores; --prefill and --decode are the start");
  f.Double("slo-ttft", 0, "with --autoscale: TTFT target, seconds");
  f.Double("slo-tpot", 0, "with --autoscale: TPOT target, seconds");
  f.Int("max-workers", 4, "with --autoscale: worker processes at most, draining ones included");
  f.Int("cores", 0,
        "with --autoscale: cores the cluster may use (0: this machine's); the router and the planner take one, each "
        "worker one, so workers stay within cores - 1 (more than the machine has oversubscribes it)");
  f.String("latency", "",
           "with --autoscale: the planner's model of one worker, a `duet profile --threads 1` fit of this machine "
           "(default: profiled at start-up into the run folder)");
  AddPlannerFlags(f);
  if (std::optional<int> exit = ParseFlagsOrExit(f, argc, argv)) return *exit;
  const bool autoscaling = f.GetBool("autoscale");
  if (absl::Status st = f.RefuseUnless(autoscaling,
                                       {"slo-ttft", "slo-tpot", "max-workers", "cores", "latency", "interval", "burst-check",
                                        "planner-target", "margin", "cooldown", "decode-utilization", "forecast",
                                        "min-prefill", "max-prefill", "min-decode", "max-decode", "max-instances",
                                        "switch-roles"},
                                       "without --autoscale");
      !st.ok()) {
    std::fprintf(stderr, "duet up: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  int max_workers = 0;
  if (autoscaling) {
    // The supervisor reaps the workers the planner drains away.
    if (absl::Status st = f.RefuseUnless(false, {"config", "colocated", "threads", "no-supervise"},
                                         "with --autoscale (supervised disaggregated pools of one-thread workers)");
        !st.ok()) {
      std::fprintf(stderr, "duet up: %s\n", std::string(st.message()).c_str());
      return 2;
    }
    const int cores = f.GetInt("cores") > 0 ? static_cast<int>(f.GetInt("cores"))
                                            : static_cast<int>(std::thread::hardware_concurrency());
    max_workers = std::min(static_cast<int>(f.GetInt("max-workers")), cores - 1);
    if (max_workers < 2) {
      std::fprintf(stderr, "duet up: --autoscale needs room for 2 workers (--max-workers, and --cores - 1 for the "
                           "router and the planner); it has %d\n", max_workers);
      return 2;
    }
    if (f.GetInt("prefill") + f.GetInt("decode") > max_workers) {
      std::fprintf(stderr, "duet up: --prefill + --decode exceed the %d workers --autoscale may run\n", max_workers);
      return 2;
    }
    if (absl::StatusOr<placement::PlannerOptions> po = PlannerFromFlags(f); !po.ok()) {
      std::fprintf(stderr, "duet up: %s\n", std::string(po.status().message()).c_str());
      return 2;
    }
  }

  placement::ClusterConfig cfg;
  if (f.IsSet("config")) {
    if (f.IsSet("prefill") || f.IsSet("decode") || f.IsSet("colocated")) {
      std::fprintf(stderr, "duet up: --config replaces --prefill/--decode/--colocated\n");
      return 2;
    }
    auto c = placement::LoadClusterConfig(f.GetString("config"));
    if (!c.ok()) {
      std::fprintf(stderr, "duet up: %s\n", c.status().ToString().c_str());
      return 2;
    }
    cfg = *c;
  } else {
    const int64_t np = f.GetInt("prefill"), nd = f.GetInt("decode"), nc = f.GetInt("colocated");
    if (np < 0 || nd < 0 || nc < 0) {
      std::fprintf(stderr, "duet up: worker counts must be >= 0\n");
      return 2;
    }
    const bool colocated = f.IsSet("colocated") && nc > 0;
    if (!colocated && (np == 0 || nd == 0)) {
      std::fprintf(stderr, "duet up: a disaggregated cluster needs at least one prefill and one decode worker\n");
      return 2;
    }
    auto add = [&](const char* role, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        placement::InstanceConfig ic;
        ic.role = role;
        ic.kv_memory_gib = f.GetDouble("kv-memory");
        cfg.instances.push_back(ic);
      }
    };
    if (colocated) {
      add("colocated", nc);
    } else {
      add("prefill", np);
      add("decode", nd);
    }
  }
  if (f.IsSet("port") || !f.IsSet("config")) cfg.router_port = static_cast<int>(f.GetInt("port"));
  if (f.IsSet("model") || cfg.model.empty()) cfg.model = f.GetString("model");
  if (f.IsSet("served-model-name")) cfg.served_model_name = f.GetString("served-model-name");
  if (cfg.model.empty()) {
    std::fprintf(stderr, "duet up: using the embedded tiny model\n");
    auto dir = testing::EnsureCachedModel("tiny", "llama");
    if (!dir.ok()) {
      std::fprintf(stderr, "duet up: %s\n", dir.status().ToString().c_str());
      return 1;
    }
    cfg.model = *dir;
  }
  std::string run_dir = f.GetString("run-dir");
  if (run_dir.empty()) run_dir = absl::StrCat(fs::temp_directory_path().string(), "/duet-up-", getpid());
  fs::create_directories(run_dir);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int default_threads =
      autoscaling ? 1
      : f.GetInt("threads") > 0 ? static_cast<int>(f.GetInt("threads"))
                                : std::max(1, cores / static_cast<int>(cfg.instances.size()));
  std::string latency_file;
  if (autoscaling) {
    absl::StatusOr<std::string> l = WorkerProfile(f, cfg.model, run_dir);
    if (!l.ok()) {
      std::fprintf(stderr, "duet up: %s\n", std::string(l.status().message()).c_str());
      return 1;
    }
    latency_file = *l;
  }

  struct sigaction sa{};
  sa.sa_handler = OnStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  cluster::ClusterOptions co;
  co.model_dir = cfg.model;
  co.served_model_name = cfg.served_model_name;
  co.duet_binary = SelfExe();
  co.run_dir = run_dir;
  co.should_stop = [] { return g_stop != 0; };
  cluster::LocalCluster c(co);
  auto stop_all = [&](int code) {
    c.Stop();
    std::fprintf(stderr, "duet up: stopped; logs in %s\n", run_dir.c_str());
    return code;
  };

  // Router first: workers register with its control port.
  std::vector<std::string> rargs = {"--policy", cfg.policy};
  // The key travels in the environment, not on a command line others can read.
  std::vector<std::string> renv;
  if (!f.GetString("api-key").empty()) renv.push_back("DUET_API_KEY=" + f.GetString("api-key"));
  if (!f.GetString("api-key-file").empty()) {
    rargs.push_back("--api-key-file");
    rargs.push_back(f.GetString("api-key-file"));
  }
  absl::Status st = c.StartRouter("", rargs, renv, absl::StrCat(f.GetString("host"), ":", cfg.router_port));
  if (!st.ok()) {
    std::fprintf(stderr, "duet up: %s\n", std::string(st.message()).c_str());
    return stop_all(1);
  }
  const int http_port = c.http_port();
  std::fprintf(stderr, "duet up: router up (http port %d, control %s)\n", http_port, c.control_address().c_str());

  std::vector<cluster::WorkerSpec> workers;
  std::vector<std::string> workers_args;  // the first worker's flags, for those --autoscale starts
  for (const placement::InstanceConfig& ic : cfg.instances) {
    cluster::WorkerSpec w;
    w.role = ic.role;
    w.flex = autoscaling && f.GetBool("switch-roles");  // the planner switches them
    w.threads = ic.threads > 0 ? ic.threads : (ic.cpus.empty() ? default_threads : static_cast<int>(ic.cpus.size()));
    w.cpus = ic.cpus;
    if (ic.max_batch_tokens > 0) w.args = {"--max-batch-tokens", std::to_string(ic.max_batch_tokens)};
    if (ic.tp != 1 || ic.pp != 1) {
      w.args.insert(w.args.end(), {"--tp", std::to_string(ic.tp), "--pp", std::to_string(ic.pp)});
    }
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--weight-dtype", &ic.weight_dtype},
                                      {"--kv-dtype", &ic.kv_dtype},
                                      {"--precision-map", &ic.precision_map}}) {
      if (!value->empty()) w.args.insert(w.args.end(), {flag, *value});
    }
    if (ic.kv_blocks > 0) {
      w.args.insert(w.args.end(), {"--kv-blocks", std::to_string(ic.kv_blocks)});
    } else {
      w.args.insert(w.args.end(), {"--kv-memory", absl::StrCat(ic.kv_memory_gib)});
    }
    if (workers_args.empty()) workers_args = w.args;
    workers.push_back(std::move(w));
  }
  // Ready when every worker listens and the router lists them all.
  st = c.StartWorkers(std::move(workers));
  if (st.code() == absl::StatusCode::kCancelled) {
    std::fprintf(stderr, "duet up: %s, stopping\n", strsignal(g_stop));
    return stop_all(0);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "duet up: %s\n", std::string(st.message()).c_str());
    return stop_all(1);
  }
  const std::string host = f.GetString("host") == "0.0.0.0" ? "127.0.0.1" : f.GetString("host");
  // Prometheus file-based discovery rereads it on change: written whole,
  // then renamed over the old one.
  auto write_targets = [&] {
    const std::string path = run_dir + "/prometheus_targets.json";
    {
      std::ofstream sd(path + ".tmp");
      sd << c.PrometheusTargets(host).dump(2) << "\n";
    }
    std::error_code ec;
    fs::rename(path + ".tmp", path, ec);
  };
  write_targets();
  std::string model_name = cfg.served_model_name.empty() ? testing::ModelBaseName(cfg.model)
                                                         : cfg.served_model_name;
  std::printf(
      "duet is serving %s at http://%s:%d/v1 (%zu workers; logs and Prometheus targets in %s)\n"
      "try:\n  curl http://%s:%d/v1/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"prompt\": \"The decode pool\", \"max_tokens\": 16}'\n",
      model_name.c_str(), host.c_str(), http_port, cfg.instances.size(), run_dir.c_str(), host.c_str(), http_port,
      model_name.c_str());
  std::fflush(stdout);
  const bool supervise = !f.GetBool("no-supervise");
  std::unique_ptr<autoscale::LocalAutoscaler> scaler;
  if (autoscaling) {
    // New workers get what the first ones got (KV size, batch budget).
    auto s = autoscale::LocalAutoscaler::Start(
        c, {.planner = *PlannerFromFlags(f),  // checked above
            .model_dir = cfg.model,
            .latency_file = latency_file,
            .policy = cfg.policy,
            .max_workers = max_workers,
            .worker_args = workers_args,
            .interval = absl::Seconds(f.GetDouble("interval")),
            .burst_check = absl::Seconds(f.GetDouble("burst-check")),
            .log = [](const std::string& line) { std::fprintf(stderr, "duet up: %s\n", line.c_str()); }});
    if (!s.ok()) {
      std::fprintf(stderr, "duet up: %s\n", std::string(s.status().message()).c_str());
      return stop_all(1);
    }
    scaler = std::move(*s);
    const placement::PlannerOptions& po = scaler->options();
    std::fprintf(stderr,
                 "duet up: autoscaling every %g s within %d workers (prefill %d..%d, decode %d..%d), SLO TTFT %g s, "
                 "TPOT %g s; one worker: %s, %.0f KV tokens\n",
                 f.GetDouble("interval"), max_workers, po.min_prefill, po.max_prefill, po.min_decode, po.max_decode,
                 po.slo.ttft, po.slo.tpot, scaler->latency().Describe().c_str(), po.prefill.kv_capacity_tokens);
  }
  while (!g_stop) {
    if (scaler) scaler->Poll();
    if (!supervise) {
      if (absl::Status alive = c.CheckAlive(); !alive.ok()) {
        std::fprintf(stderr, "duet up: %s\n", std::string(alive.message()).c_str());
        return stop_all(1);
      }
    } else if (c.Supervise([](const std::string& line) { std::fprintf(stderr, "duet up: %s\n", line.c_str()); })) {
      write_targets();  // A restarted worker's metrics port is new.
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "duet up: %s, stopping\n", strsignal(g_stop));
  return stop_all(0);
}

}  // namespace duet::tools

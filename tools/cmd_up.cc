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
#include "base/flags.h"
#include "cluster/local_cluster.h"
#include "placement/cluster_config.h"
#include "tools/commands.h"
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
  if (std::optional<int> exit = ParseFlagsOrExit(f, argc, argv)) return *exit;

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
      f.GetInt("threads") > 0 ? static_cast<int>(f.GetInt("threads"))
                              : std::max(1, cores / static_cast<int>(cfg.instances.size()));

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
  for (const placement::InstanceConfig& ic : cfg.instances) {
    cluster::WorkerSpec w;
    w.role = ic.role;
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
  while (!g_stop) {
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

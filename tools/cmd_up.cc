// duet up: a whole cluster on this machine, as child processes.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/subprocess.h"
#include "http/client.h"
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

std::string Tail(const std::string& path, size_t max_bytes = 4000) {
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  return s.size() > max_bytes ? "..." + s.substr(s.size() - max_bytes) : s;
}

// Waits for a child's ready file; fails if the child exits first.
absl::StatusOr<nlohmann::json> WaitReady(Subprocess& p, const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded()) return j;
    }
    if (auto st = p.TryWait()) {
      return absl::UnavailableError(absl::StrCat(p.name(), " ", DescribeExit(*st), " during start-up; its log (",
                                                 p.log_path(), "):\n", Tail(p.log_path())));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(p.name(), " did not become ready within ",
                                                  absl::FormatDuration(timeout), "; see ", p.log_path()));
}

volatile sig_atomic_t g_stop = 0;
void OnStop(int sig) { g_stop = sig; }

}  // namespace

int RunUp(int argc, char** argv) {
  FlagSet f("duet up",
            "Starts a local cluster serving the OpenAI API: a router and N prefill + M decode\n"
            "workers (or K colocated workers) as child processes, on the embedded tiny model\n"
            "unless --model is given. Prints the endpoint and a curl example; stops everything on\n"
            "Ctrl-C or SIGTERM, or when a process dies unexpectedly (showing its log).");
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
  absl::Status s = f.Parse(argc, argv);
  if (f.help_requested()) {
    std::fputs(f.Usage().c_str(), stdout);
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "duet up: %s\n", std::string(s.message()).c_str());
    return 2;
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
      f.GetInt("threads") > 0 ? static_cast<int>(f.GetInt("threads"))
                              : std::max(1, cores / static_cast<int>(cfg.instances.size()));

  struct sigaction sa{};
  sa.sa_handler = OnStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const std::string exe = SelfExe();
  std::vector<std::unique_ptr<Subprocess>> procs;
  auto stop_all = [&](int code) {
    for (auto it = procs.rbegin(); it != procs.rend(); ++it) (*it)->Terminate(absl::Seconds(5));
    std::fprintf(stderr, "duet up: stopped; logs in %s\n", run_dir.c_str());
    return code;
  };

  // Router first: workers register with its control port.
  std::vector<std::string> rargs = {exe, "router", "--model", cfg.model, "--listen",
                                    absl::StrCat(f.GetString("host"), ":", cfg.router_port),
                                    "--control-listen", "127.0.0.1:0", "--policy", cfg.policy,
                                    "--ready-file", run_dir + "/router.json"};
  if (!cfg.served_model_name.empty()) {
    rargs.push_back("--served-model-name");
    rargs.push_back(cfg.served_model_name);
  }
  // The key travels in the environment, not on a command line others can read.
  std::vector<std::string> renv;
  if (!f.GetString("api-key").empty()) renv.push_back("DUET_API_KEY=" + f.GetString("api-key"));
  if (!f.GetString("api-key-file").empty()) {
    rargs.push_back("--api-key-file");
    rargs.push_back(f.GetString("api-key-file"));
  }
  auto router = Subprocess::Start(rargs, renv, run_dir + "/router.log");
  if (!router.ok()) {
    std::fprintf(stderr, "duet up: %s\n", router.status().ToString().c_str());
    return 1;
  }
  (*router)->set_name("router");
  procs.push_back(std::move(*router));
  auto rready = WaitReady(*procs.back(), run_dir + "/router.json", absl::Seconds(60));
  if (!rready.ok()) {
    std::fprintf(stderr, "duet up: %s\n", rready.status().ToString().c_str());
    return stop_all(1);
  }
  const std::string control = (*rready)["control"];
  const int http_port = (*rready)["http_port"];
  std::fprintf(stderr, "duet up: router up (http port %d, control %s)\n", http_port, control.c_str());

  std::map<std::string, int> counters;
  nlohmann::json targets = nlohmann::json::array();
  targets.push_back({{"targets", {absl::StrCat(f.GetString("host") == "0.0.0.0" ? "127.0.0.1" : f.GetString("host"), ":", http_port)}},
                     {"labels", {{"role", "router"}, {"worker", "router"}}}});
  for (const placement::InstanceConfig& ic : cfg.instances) {
    const std::string id = absl::StrCat(ic.role, "-", counters[ic.role]++);
    const std::string cmd = ic.role == "colocated" ? "worker" : ic.role;
    std::vector<std::string> args = {exe, cmd, "--model", cfg.model, "--router", control, "--worker-id", id,
                                     "--metrics-port", "0", "--threads",
                                     std::to_string(ic.threads > 0 ? ic.threads : (ic.cpus.empty() ? default_threads : static_cast<int>(ic.cpus.size()))),
                                     "--max-batch-tokens", std::to_string(ic.max_batch_tokens),
                                     "--ready-file", run_dir + "/" + id + ".json"};
    if (ic.role == "colocated") args.insert(args.begin() + 2, "--role=colocated");
    if (ic.kv_blocks > 0) {
      args.push_back("--kv-blocks");
      args.push_back(std::to_string(ic.kv_blocks));
    } else {
      args.push_back("--kv-memory");
      args.push_back(absl::StrCat(ic.kv_memory_gib));
    }
    if (!cfg.served_model_name.empty()) {
      args.push_back("--served-model-name");
      args.push_back(cfg.served_model_name);
    }
    auto p = Subprocess::Start(args, {}, run_dir + "/" + id + ".log", ic.cpus);
    if (!p.ok()) {
      std::fprintf(stderr, "duet up: %s\n", p.status().ToString().c_str());
      return stop_all(1);
    }
    (*p)->set_name(id);
    procs.push_back(std::move(*p));
  }
  for (size_t i = 1; i < procs.size(); ++i) {
    auto ready = WaitReady(*procs[i], run_dir + "/" + procs[i]->name() + ".json", absl::Seconds(120));
    if (!ready.ok()) {
      std::fprintf(stderr, "duet up: %s\n", ready.status().ToString().c_str());
      return stop_all(1);
    }
    targets.push_back({{"targets", {absl::StrCat("127.0.0.1:", (*ready)["metrics_port"].get<int>())}},
                       {"labels", {{"role", (*ready)["role"]}, {"worker", procs[i]->name()}}}});
  }
  {
    std::ofstream sd(run_dir + "/prometheus_targets.json");
    sd << targets.dump(2) << "\n";
  }
  // Ready when the router's /health says every role it needs has a worker.
  const std::string host = f.GetString("host") == "0.0.0.0" ? "127.0.0.1" : f.GetString("host");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool healthy = false;
  while (!g_stop && absl::Now() < deadline) {
    auto r = http::HttpCall(host, http_port, "GET", "/stats", "", absl::Seconds(2));
    if (r.ok() && r->status == 200) {
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      if (!j.is_discarded() && j.contains("workers") && j["workers"].size() == cfg.instances.size()) {
        healthy = true;
        break;
      }
    }
    for (auto& p : procs) {
      if (auto st = p->TryWait()) {
        std::fprintf(stderr, "duet up: %s %s; its log (%s):\n%s\n", p->name().c_str(), DescribeExit(*st).c_str(),
                     p->log_path().c_str(), Tail(p->log_path()).c_str());
        return stop_all(1);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!healthy && !g_stop) {
    std::fprintf(stderr, "duet up: workers did not all register within 60 s; logs in %s\n", run_dir.c_str());
    return stop_all(1);
  }
  std::string model_name = cfg.served_model_name.empty() ? testing::ModelBaseName(cfg.model)
                                                         : cfg.served_model_name;
  std::printf(
      "duet is serving %s at http://%s:%d/v1 (%zu workers; logs and Prometheus targets in %s)\n"
      "try:\n  curl http://%s:%d/v1/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"prompt\": \"The decode pool\", \"max_tokens\": 16}'\n",
      model_name.c_str(), host.c_str(), http_port, cfg.instances.size(), run_dir.c_str(), host.c_str(), http_port,
      model_name.c_str());
  std::fflush(stdout);
  while (!g_stop) {
    for (auto& p : procs) {
      if (auto st = p->TryWait()) {
        std::fprintf(stderr, "duet up: %s %s unexpectedly; its log (%s):\n%s\n", p->name().c_str(),
                     DescribeExit(*st).c_str(), p->log_path().c_str(), Tail(p->log_path()).c_str());
        return stop_all(1);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "duet up: %s, stopping\n", strsignal(g_stop));
  return stop_all(0);
}

}  // namespace duet::tools

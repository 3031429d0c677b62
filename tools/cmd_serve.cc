// The serving processes: duet router | prefill | decode | worker --role=...
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/serving_defaults.h"
#include "kvcache/prefix_tree.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "decode/colocated_service.h"
#include "decode/decode_service.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "prefill/prefill_service.h"
#include "router/router.h"
#include "tools/commands.h"
#include "tools/load_flags.h"
#include "engine/testing/model_maker.h"
#include "worker/engine_core.h"
#include "worker/flex_service.h"
#include "worker/runtime.h"

namespace duet::tools {
namespace {

// Blocks SIGINT and SIGTERM in every thread (call before starting any), so
// WaitForSignal can take them synchronously.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForSignal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModelDir(const FlagSet& f) {
  std::string dir = f.GetString("model");
  if (!dir.empty()) return dir;
  return testing::EnsureCachedModel("tiny", "llama");
}

std::string ServedName(const FlagSet& f, const std::string& dir) {
  std::string n = f.GetString("served-model-name");
  return n.empty() ? testing::ModelBaseName(dir) : n;
}

// Parses a flag's result or exits with the usage error (code 2).
int UsageError(const std::string& cmd, const absl::Status& s) {
  std::fprintf(stderr, "duet %s: %s\n", cmd.c_str(), std::string(s.message()).c_str());
  return 2;
}

// --- router ---------------------------------------------------------------

int Router(int argc, char** argv) {
  FlagSet f("duet router",
            "The OpenAI-compatible front door: registers workers, dispatches each request to a\n"
            "prefill and a decode worker, streams tokens back. Needs the model directory for its\n"
            "tokenizer and config only (no weights). Stops on SIGINT/SIGTERM.");
  router::AddRouterFlags(f);
  f.String("ready-file", "", "write {\"http\", \"control\", \"pid\"} as JSON here once serving");
  // Flags are checked first, so `--help` after them says whether they parse.
  if (std::optional<int> exit = ParseFlagsOrExit(f, argc, argv)) return *exit;
  auto opts = router::RouterOptionsFromFlags(f);
  if (!opts.ok()) return UsageError("router", opts.status());
  if (opts->model_dir.empty()) {
    auto dir = testing::EnsureCachedModel("tiny", "llama");
    if (!dir.ok()) return UsageError("router", dir.status());
    opts->model_dir = *dir;
  }
  sigset_t sigs = BlockStopSignals();
  router::Router r;
  absl::Status s = r.Start(*opts);
  if (!s.ok()) {
    std::fprintf(stderr, "duet router: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "duet router: serving %s on http port %d, workers register at %s\n",
               r.served_model_name().c_str(), r.http_port(), r.control_address().c_str());
  s = WriteJsonFile(f.GetString("ready-file"),
                    {{"http_port", r.http_port()}, {"control", r.control_address()}, {"pid", getpid()}});
  if (!s.ok()) LOG(ERROR) << s;
  int sig = WaitForSignal(sigs);
  std::fprintf(stderr, "duet router: %s, stopping\n", strsignal(sig));
  r.Stop();
  return 0;
}

// --- workers ----------------------------------------------------------------

void AddWorkerFlags(FlagSet& f, bool with_role) {
  if (with_role) {
    f.String("role", "colocated",
             "prefill | decode | colocated | flex (prefill or decode in turn, switched by the router's POST "
             "/workers/role: it drains its role and registers again in the other, its weights kept loaded)");
    f.String("initial-role", "prefill", "flex: the role it serves first, prefill | decode");
  }
  f.String("model", "", "Hugging Face model directory (default: the embedded tiny model)");
  f.String("served-model-name", "", "the model name to register (default: the directory's name)");
  f.String("router", "127.0.0.1:7000", "HOST:PORT of the router's control port");
  f.String("listen", "127.0.0.1:0", "HOST:PORT of this worker's control port (port 0 picks one)");
  f.Int("metrics-port", 0, "port of /metrics (0 picks one, -1 disables)");
  f.String("metrics-host", "127.0.0.1", "address /metrics listens on");
  f.String("worker-id", "", "unique id in the cluster (default: ROLE-PID)");
  f.Int("threads", 0, "CPU threads for the engine (0: every core this process may use)");
  AddLoadFlags(f);
  f.Double("kv-memory", 0.25, "KV cache size in GiB (ignored when --kv-blocks is set)");
  f.Int("kv-blocks", 0, "KV cache size in blocks");
  f.Int("block-size", 16, "tokens per KV block (prefill and decode must agree)");
  f.Int("max-batch-tokens", kDefaultMaxBatchTokens, "tokens per engine step (prefill chunks and decodes)");
  f.Int("max-running", 256, "decode/colocated: most requests in the running batch");
  f.Int("lease-ms", 60000, "prefill: how long offered KV blocks wait for decode to pull them");
  f.Int("pull-timeout-ms", 5000,
        "decode: how long one KV pull may take before it fails (a dead peer is found sooner, by keepalives)");
  f.Bool("no-prefix-cache",
         "prefill/colocated: compute every prompt whole (default: reuse the KV of cached block-aligned prefixes, "
         "the knowledge tree)");
  f.Double("kv-host-memory", 0, "prefill/colocated: GiB of host memory for the prefix cache's second tier (0: none)");
  f.Int("kv-host-blocks", 0, "prefill/colocated: the second tier's size in blocks (ignores --kv-host-memory when set)");
  f.String("kv-cache-policy", "pgdsf", "prefill/colocated: the prefix cache's replacement, pgdsf | gdsf | lru | lfu");
  f.String("kv-cache-cost-profile", "",
           "prefill/colocated: a latency profile (duet profile --out) of this model whose prefill times are PGDSF's "
           "cost of a cached run (default: the run's FLOPs)");
  f.Int("reorder-window", 0,
        "prefill: admit the queued prompt with the most cached tokens first, no request overtaken by more than N "
        "later ones (0: first come, first served)");
  f.String("ready-file", "", "write {\"control\", \"metrics_port\", \"worker_id\", \"pid\"} as JSON once listening");
  f.Int("heartbeat-ms", 500, "heartbeat interval");
  f.Int("drain-timeout-s", 30,
        "on SIGTERM, seconds to let running requests finish and leases be pulled (the router sends nothing new "
        "meanwhile) before stopping; a second SIGTERM or SIGINT stops at once");
}

// Drains after the first SIGTERM: the router is told, and the worker runs
// until it holds no request and no lease, `timeout` passes, or a second
// signal (or a SIGINT) comes. Returns the signal that ends the process.
int Drain(worker::WorkerRuntime& runtime, worker::WorkerService& service, const sigset_t& sigs, int sig,
          absl::Duration timeout, const std::string& cmd) {
  if (sig != SIGTERM || timeout <= absl::ZeroDuration()) return sig;
  runtime.Drain();
  std::fprintf(stderr, "duet %s: SIGTERM: draining (up to %s; a second signal stops at once)\n", cmd.c_str(),
               absl::FormatDuration(timeout).c_str());
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (worker::WorkerIdle(service.Stats())) {
      std::fprintf(stderr, "duet %s: drained\n", cmd.c_str());
      return sig;
    }
    const timespec poll{0, 50 * 1000 * 1000};
    if (int again = sigtimedwait(&sigs, nullptr, &poll); again > 0) return again;
  }
  std::fprintf(stderr, "duet %s: still busy after %s; stopping\n", cmd.c_str(), absl::FormatDuration(timeout).c_str());
  return sig;
}


// `any_role`: `duet worker`, whose flags include --role and --initial-role.
int RunWorkerRole(const std::string& role, const FlagSet& f, bool any_role) {
  const std::string cmd = role == "colocated" || role == "flex" ? "worker" : role;
  if (f.GetInt("block-size") <= 0) return UsageError(cmd, absl::InvalidArgumentError("--block-size must be > 0"));
  if (f.GetInt("pull-timeout-ms") <= 0) return UsageError(cmd, absl::InvalidArgumentError("--pull-timeout-ms must be > 0"));
  if (f.GetInt("kv-blocks") < 0 || f.GetDouble("kv-memory") <= 0) {
    return UsageError(cmd, absl::InvalidArgumentError("--kv-blocks must be >= 0 and --kv-memory > 0"));
  }
  const bool cache = !f.GetBool("no-prefix-cache");
  for (absl::Status st :
       {f.RefuseUnless(role != "decode",
                       {"no-prefix-cache", "kv-host-memory", "kv-host-blocks", "kv-cache-policy", "kv-cache-cost-profile"},
                       "on a decode worker (it reuses no prefixes)"),
        f.RefuseUnless(role == "prefill" || role == "flex", {"reorder-window"}, "outside the prefill and flex roles"),
        f.RefuseUnless(role == "decode" || role == "flex", {"pull-timeout-ms"}, "outside the decode and flex roles"),
        f.RefuseUnless(role == "flex" || !any_role, {"initial-role"}, "outside the flex role"),
        f.RefuseUnless(cache, {"kv-host-memory", "kv-host-blocks", "kv-cache-policy", "kv-cache-cost-profile", "reorder-window"},
                       "with --no-prefix-cache")}) {
    if (!st.ok()) return UsageError(cmd, st);
  }
  auto policy = kvcache::ParsePolicy(f.GetString("kv-cache-policy"));
  if (!policy.ok()) return UsageError(cmd, policy.status());
  if (f.GetDouble("kv-host-memory") < 0 || f.GetInt("kv-host-blocks") < 0) {
    return UsageError(cmd, absl::InvalidArgumentError("--kv-host-memory and --kv-host-blocks must be >= 0"));
  }
  auto dir = ModelDir(f);
  if (!dir.ok()) return UsageError(cmd, dir.status());
  auto load_or = LoadOptionsFromFlags(f);
  if (!load_or.ok()) return UsageError(cmd, load_or.status());
  const engine::LoadOptions load = *std::move(load_or);
  const std::string name = ServedName(f, *dir);
  worker::RuntimeOptions ro;
  ro.worker_id = f.GetString("worker-id").empty() ? absl::StrCat(role, "-", getpid()) : f.GetString("worker-id");
  ro.listen = f.GetString("listen");
  ro.router_address = f.GetString("router");
  ro.metrics_port = static_cast<int>(f.GetInt("metrics-port"));
  ro.metrics_host = f.GetString("metrics-host");
  ro.heartbeat_interval = absl::Milliseconds(std::max<int64_t>(1, f.GetInt("heartbeat-ms")));
  // What every role's engine takes from the flags.
  const worker::EngineOptions engine{
      .model_dir = *dir,
      .served_model_name = name,
      .threads = static_cast<int>(f.GetInt("threads")),
      .load = load,
      .kv_blocks = f.GetInt("kv-blocks"),
      .kv_memory_bytes = static_cast<int64_t>(f.GetDouble("kv-memory") * (1 << 30)),
      .block_size = f.GetInt("block-size"),
      .token_budget = f.GetInt("max-batch-tokens"),
      .cache = {.enabled = cache,
                .host_memory_bytes = static_cast<int64_t>(f.GetDouble("kv-host-memory") * (1 << 30)),
                .host_blocks = f.GetInt("kv-host-blocks"),
                .policy = *policy,
                .cost_profile = f.GetString("kv-cache-cost-profile")}};

  sigset_t sigs = BlockStopSignals();
  worker::WorkerRuntime runtime(ro);
  // A prefill or decode service (with a KV transport of its own) over
  // `weights` (null: its own load).
  worker::RoleServiceFactory make = [&](proto::Role r, std::shared_ptr<const worker::LoadedModel> weights)
      -> absl::StatusOr<std::unique_ptr<worker::WorkerService>> {
    ASSIGN_OR_RETURN(kvtransfer::KvTransportPtr transport, kvtransfer::NewUcxTransport({}));
    if (r == proto::ROLE_PREFILL) {
      prefill::PrefillServiceOptions o;
      o.engine = engine;
      o.engine.loaded = std::move(weights);
      o.lease_duration = absl::Milliseconds(f.GetInt("lease-ms"));
      o.reorder_window = f.GetInt("reorder-window");
      o.transport = std::move(transport);
      ASSIGN_OR_RETURN(auto svc, prefill::PrefillService::Create(std::move(o), &runtime));
      return std::unique_ptr<worker::WorkerService>(std::move(svc));
    }
    decode::DecodeOptions o;
    o.engine = engine;
    o.engine.loaded = std::move(weights);
    o.max_running = f.GetInt("max-running");
    o.pull_timeout = absl::Milliseconds(f.GetInt("pull-timeout-ms"));
    o.transport = std::move(transport);
    ASSIGN_OR_RETURN(auto svc, decode::DecodeService::Create(std::move(o), &runtime));
    return std::unique_ptr<worker::WorkerService>(std::move(svc));
  };
  std::unique_ptr<worker::WorkerService> service;
  absl::Status s;
  if (role == "prefill" || role == "decode") {
    auto svc = make(role == "prefill" ? proto::ROLE_PREFILL : proto::ROLE_DECODE, nullptr);
    if (!svc.ok()) s = svc.status(); else service = std::move(*svc);
  } else if (role == "flex") {
    const std::string start = f.GetString("initial-role");
    if (start != "prefill" && start != "decode") {
      return UsageError(cmd, absl::InvalidArgumentError(
                                 absl::StrCat("--initial-role must be prefill or decode, got \"", start, "\"")));
    }
    auto weights = worker::LoadModel(engine);
    if (!weights.ok()) {
      s = weights.status();
    } else {
      auto svc = worker::FlexService::Create(
          {.factory = make,
           .weights = *std::move(weights),
           .initial = start == "prefill" ? proto::ROLE_PREFILL : proto::ROLE_DECODE,
           .drain_timeout = absl::Seconds(f.GetInt("drain-timeout-s")),
           .on_fatal = [](absl::Status why) {
             std::fprintf(stderr, "duet worker: %s\n", why.ToString().c_str());
             kill(getpid(), SIGTERM);
           }},
          &runtime);
      if (!svc.ok()) s = svc.status(); else service = std::move(*svc);
    }
  } else if (role == "colocated") {
    decode::ColocatedOptions o;
    o.engine = engine;
    o.max_running = f.GetInt("max-running");
    auto svc = decode::ColocatedService::Create(std::move(o), &runtime);
    if (!svc.ok()) s = svc.status(); else service = std::move(*svc);
  } else {
    return UsageError(cmd, absl::InvalidArgumentError(absl::StrCat(
                               "--role must be prefill, decode, colocated or flex, got \"", role, "\"")));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "duet %s: %s\n", cmd.c_str(), s.ToString().c_str());
    return 1;
  }
  // A refused registration (protocol version, model name) ends the process.
  s = runtime.Start(service.get(), [](absl::Status why) {
    std::fprintf(stderr, "duet: %s\n", why.ToString().c_str());
    kill(getpid(), SIGTERM);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "duet %s: %s\n", cmd.c_str(), s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "duet %s: %s serving %s, control %s, metrics port %d, router %s\n", cmd.c_str(),
               runtime.worker_id().c_str(), name.c_str(), runtime.control_address().c_str(),
               runtime.metrics_port(), ro.router_address.c_str());
  s = WriteJsonFile(f.GetString("ready-file"), {{"control", runtime.control_address()},
                                                {"metrics_port", runtime.metrics_port()},
                                                {"worker_id", runtime.worker_id()},
                                                {"role", role},
                                                {"pid", getpid()}});
  if (!s.ok()) LOG(ERROR) << s;
  int sig = Drain(runtime, *service, sigs, WaitForSignal(sigs), absl::Seconds(f.GetInt("drain-timeout-s")), cmd);
  std::fprintf(stderr, "duet %s: %s, stopping\n", cmd.c_str(), strsignal(sig));
  runtime.Stop();
  service.reset();
  return 0;
}

int Worker(const std::string& fixed_role, int argc, char** argv) {
  const bool any = fixed_role.empty();
  FlagSet f(any ? "duet worker" : "duet " + fixed_role,
            fixed_role == "prefill"
                ? "A prefill worker: runs prompts (FCFS, token budget, chunking), samples the first\n"
                  "token, and holds the KV blocks under a lease until the chosen decode worker pulls\n"
                  "them over UCX. Registers with the router; stops on SIGINT/SIGTERM."
            : fixed_role == "decode"
                ? "A decode worker: admits requests when its KV pool has room, pulls their KV from the\n"
                  "prefill worker over UCX, and runs continuous-batching decode steps, preempting the\n"
                  "newest request under memory pressure. Registers with the router."
                : "A worker of any role; --role=colocated runs both phases in one engine (continuous\n"
                  "batching with chunked prefill): the baseline disaggregation must beat.");
  AddWorkerFlags(f, any);
  if (std::optional<int> exit = ParseFlagsOrExit(f, argc, argv)) return *exit;
  return RunWorkerRole(any ? f.GetString("role") : fixed_role, f, any);
}

}  // namespace

int RunRouter(int argc, char** argv) { return Router(argc, argv); }
int RunPrefill(int argc, char** argv) { return Worker("prefill", argc, argv); }
int RunDecode(int argc, char** argv) { return Worker("decode", argc, argv); }
int RunWorker(int argc, char** argv) { return Worker("", argc, argv); }

}  // namespace duet::tools

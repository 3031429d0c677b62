// duet planner: the SLA planner against a live cluster (autoscale/).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "autoscale/actuator.h"
#include "autoscale/live_planner.h"
#include "base/flags.h"
#include "base/io_thread.h"
#include "base/metrics.h"
#include "base/status_macros.h"
#include "http/client.h"
#include "http/server.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/planner.h"
#include "tools/commands.h"
#include "tools/planner_flags.h"
#include "tools/workload_flags.h"

namespace duet::tools {
namespace {

volatile sig_atomic_t g_stop = 0;
void OnStop(int sig) { g_stop = sig; }

void AddFlags(FlagSet& f) {
  f.String("router", "http://127.0.0.1:8000", "the router's API (its GET /figures is read each interval)");
  f.Bool("dry-run", "log each decision and change nothing (no Kubernetes needed)");
  f.String("k8s-api", "", "the Kubernetes API server (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)");
  f.String("namespace", "", "namespace of the Deployments (default: the service account's)");
  f.String("prefill-deployment", "duet-prefill", "the prefill workers' Deployment");
  f.String("decode-deployment", "duet-decode", "the decode workers' Deployment");
  f.String("service-account-dir", "/var/run/secrets/kubernetes.io/serviceaccount",
           "the pod's service account mount (token, ca.crt, namespace)");
  f.String("model", "", "model the workers serve, for the planner's simulation: a preset (opt-13b, ...), a HF id, "
                        "or a model dir / config.json (required)");
  f.String("latency", "", "latency model of one instance (as duet sim: a `duet profile` fit, a DistServe fit, "
                          "roofline:GPU; default roofline:--gpu)");
  f.String("gpu", "a100-80g", "GPU of an instance: its KV capacity from the memory left after the weights");
  f.Int("tp", 1, "tensor parallel degree of an instance");
  f.Int("pp", 1, "pipeline stages of an instance");
  f.Double("kv-capacity-tokens", 0,
           "KV tokens per instance (0: from --kv-memory; else what the router reports of its decode workers at "
           "start-up; else from the GPUs' memory)");
  f.Double("kv-memory", 0, "KV cache per instance in GiB, as the workers' flag says (the KV capacity at the model's "
                           "bytes per token)");
  f.Int("max-batch-tokens", 0, "tokens per prefill batch (0: the simulator's default)");
  f.Int("max-batch-size", 256, "requests per decode step");
  f.Int("seed", 1, "the planner's random stream (its simulated windows)");
  AddLatencyFlags(f);
  f.Double("slo-ttft", 1.0, "TTFT target, seconds");
  f.Double("slo-tpot", 0.1, "TPOT target, seconds");
  AddPlannerFlags(f);
  f.String("metrics-host", "127.0.0.1", "address of /metrics and /health");
  f.Int("metrics-port", 9200, "port of /metrics and /health (-1: none)");
  f.Bool("once", "make one decision, print it and exit (0: it was applied)");
}

absl::StatusOr<placement::InstanceSpec> Shape(const FlagSet& f, const placement::ModelSpec& model,
                                              const http::Endpoint& router) {
  placement::InstanceSpec s;
  s.par = {.tp = static_cast<int>(f.GetInt("tp")), .pp = static_cast<int>(f.GetInt("pp"))};
  if (s.par.tp < 1 || s.par.pp < 1) return absl::InvalidArgumentError("--tp and --pp must be >= 1");
  s.kv_capacity_tokens = f.GetDouble("kv-capacity-tokens");
  if (s.kv_capacity_tokens <= 0 && f.GetDouble("kv-memory") > 0) {
    s.kv_capacity_tokens = f.GetDouble("kv-memory") * (1 << 30) / static_cast<double>(model.KvBytesPerToken());
  }
  if (s.kv_capacity_tokens <= 0) {
    // The workers' own figure; the GPUs' memory below when the router has none.
    if (absl::StatusOr<double> kv = autoscale::WorkerKvCapacity(router); kv.ok()) s.kv_capacity_tokens = *kv;
  }
  if (s.kv_capacity_tokens <= 0) {
    ASSIGN_OR_RETURN(placement::GpuSpec g, placement::LoadGpu(f.GetString("gpu")));
    s.kv_capacity_tokens = placement::KvCapacity(model, g, s.par);
    if (s.kv_capacity_tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(model.name, " does not fit on ", s.par.gpus(), " x ", g.name));
    }
  }
  if (f.GetInt("max-batch-tokens") > 0) s.max_batch_tokens = f.GetInt("max-batch-tokens");
  s.max_batch_size = f.GetInt("max-batch-size");
  return s;
}

absl::Status Run(const FlagSet& f) {
  if (f.GetString("model").empty()) return absl::InvalidArgumentError("--model is required (what the workers serve)");
  if (f.GetBool("switch-roles")) {
    return absl::InvalidArgumentError("--switch-roles: a Kubernetes pod keeps its role (duet up --autoscale switches)");
  }
  RETURN_IF_ERROR(f.RefuseUnless(!f.GetBool("dry-run"),
                                 {"k8s-api", "namespace", "prefill-deployment", "decode-deployment",
                                  "service-account-dir"},
                                 "with --dry-run"));
  ASSIGN_OR_RETURN(placement::PlannerOptions po, PlannerFromFlags(f));
  ASSIGN_OR_RETURN(placement::ModelSpec model, placement::LoadModelSpec(f.GetString("model")));
  const std::string spec =
      f.GetString("latency").empty() ? absl::StrCat("roofline:", f.GetString("gpu")) : f.GetString("latency");
  ASSIGN_OR_RETURN(std::unique_ptr<placement::LatencyModel> latency,
                   LoadLatencyWithOverhead(f, spec, model, static_cast<uint64_t>(f.GetInt("seed"))));
  ASSIGN_OR_RETURN(http::Endpoint router, http::ParseEndpoint(f.GetString("router")));
  ASSIGN_OR_RETURN(po.prefill, Shape(f, model, router));
  po.decode = po.prefill;
  po.seed = static_cast<uint64_t>(f.GetInt("seed"));

  auto log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  std::unique_ptr<autoscale::Actuator> actuator;
  if (f.GetBool("dry-run")) {
    actuator = std::make_unique<autoscale::DryRunActuator>(log);
  } else {
    ASSIGN_OR_RETURN(actuator, autoscale::KubernetesActuator::Create(
                                   {.api = f.GetString("k8s-api"),
                                    .service_account_dir = f.GetString("service-account-dir"),
                                    .namespace_name = f.GetString("namespace"),
                                    .prefill_deployment = f.GetString("prefill-deployment"),
                                    .decode_deployment = f.GetString("decode-deployment")}));
  }
  const absl::Duration interval = absl::Seconds(f.GetDouble("interval"));
  placement::Planner planner(model, *latency, po);
  const absl::Duration check = absl::Seconds(f.GetDouble("burst-check"));
  autoscale::LivePlanner live(planner, *actuator,
                              {.figures = autoscale::RouterFigures(router, interval),
                               .recent = check > absl::ZeroDuration() ? autoscale::RouterFigures(router, check) : nullptr,
                               .interval = interval,
                               .check = check,
                               .log = log});
  std::fprintf(stderr,
               "duet planner: %s (%s, %.0f KV tokens per instance), SLO TTFT %g s, TPOT %g s; router %s:%d, every %g "
               "s, actuator %s\n",
               model.name.c_str(), latency->Describe().c_str(), po.prefill.kv_capacity_tokens, po.slo.ttft,
               po.slo.tpot, router.host.c_str(), router.port, f.GetDouble("interval"), actuator->name().c_str());
  if (f.GetBool("once")) return live.Step();

  IoThread io;
  std::unique_ptr<http::HttpServer> metrics;
  if (f.GetInt("metrics-port") >= 0) {
    ASSIGN_OR_RETURN(metrics, http::HttpServer::Start(
                                  io.context(), absl::StrCat(f.GetString("metrics-host"), ":", f.GetInt("metrics-port")),
                                  http::ServeMetricsAndHealth));
    std::fprintf(stderr, "duet planner: metrics on %s:%d/metrics\n", f.GetString("metrics-host").c_str(),
                 metrics->port());
  }
  struct sigaction sa{};
  sa.sa_handler = OnStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  live.Run([] { return g_stop != 0; });
  std::fprintf(stderr, "duet planner: %s, stopping\n", strsignal(g_stop));
  return absl::OkStatus();
}

}  // namespace

int RunPlanner(int argc, char** argv) {
  FlagSet f("duet planner",
            "The SLA planner on a live cluster: every --interval it reads the router's figures (GET /figures: "
            "arrivals, prompt and output lengths, cached share, TTFT/TPOT, queues, KV), forecasts the next "
            "interval, corrects the latency model by observed / predicted, and simulates the forecast load to "
            "choose the fewest prefill and decode instances that meet the SLOs (see placement/planner.h); then "
            "sets the prefill and decode Deployments' replicas on Kubernetes (the scale subresource, as the pod's "
            "service account), or with --dry-run only logs. A pool grows at once and shrinks after --cooldown, "
            "when the smaller pool still meets the SLOs at the load scaled by N/(N-1). Decisions go to stdout and "
            "to /metrics (duet_planner_*). Stops on Ctrl-C or SIGTERM.");
  AddFlags(f);
  return RunWithFlags(f, argc, argv, Run);
}

}  // namespace duet::tools

// duet sim: the cluster simulator (placement/sim.h) from the command line.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dispatch/dispatch.h"
#include "base/serving_defaults.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/planner.h"
#include "placement/sim.h"
#include "placement/workload.h"
#include "placement/cluster_config.h"
#include "tools/commands.h"
#include "tools/planner_flags.h"
#include "tools/workload_flags.h"

namespace duet::tools {
namespace {

using placement::ClusterSpec;
using placement::InstanceRole;
using placement::InstanceSpec;
using placement::ModelSpec;

void AddSimFlags(FlagSet& f) {
  f.String("model", "opt-13b", "model: a preset (opt-13b, llama-2-7b, ...), a HF id, or a model dir / config.json");
  f.String("latency", "",
           "latency model: a JSON file (DistServe profile, or {\"kind\": \"roofline\", ...}), or constant:P,D | "
           "exponential:P,D (seconds per prefill batch, per decode step) | roofline:GPU (default roofline:GPU of --gpu)");
  f.String("cluster", "", "cluster file(s) (duet up --config format, with gpu and kv_link_gbps), comma-separated");
  f.Int("prefill", 1, "prefill instances (without --cluster)");
  f.Int("decode", 1, "decode instances (without --cluster)");
  f.Int("colocated", 0, "colocated instances instead of prefill + decode (without --cluster)");
  f.Int("tp", 1, "tensor parallel degree of every instance (without --cluster)");
  f.Int("pp", 1, "pipeline stages of every instance (without --cluster)");
  f.String("gpu", "a100-80g", "GPU of the instances: KV capacity from its memory, link bandwidths, roofline");
  f.Double("kv-capacity-tokens", 0, "KV tokens per instance (0: from the GPUs' memory after the weights)");
  f.Double("link-gbps", 0, "prefill -> decode KV bandwidth, GB/s (0: the GPU's node link)");
  f.String("policy", "least_loaded",
           "dispatch: least_loaded | round_robin | cache_aware (with --cache-blocks: the prefill whose cache lacks "
           "the fewest tokens, plus its queue)");
  f.String("cache-aware-weights", CacheAwareWeights{}.ToString(),
           "cache_aware: U,Q, a prefill's score = U x prompt tokens its cache lacks + Q x its queued prefill tokens "
           "(the router's flag)");
  f.Bool("chunked-prefill", "colocated: chunked prefill (decode and prompt chunks in one step)");
  f.Double("interference-prefill", 0,
           "instances share one host's memory bus: a prefill batch started while another instance computes "
           "takes (1 + this) times as long (CPU workers on one machine; 0 for GPUs)");
  f.Double("interference-decode", 0, "the same for decode steps");
  f.Int("chunk-tokens", 512, "colocated chunked prefill: tokens per step");
  f.Int("max-batch-tokens", kDefaultMaxBatchTokens,
        "prefill token budget per batch (also for --cluster instances without their own)");
  f.Int("max-prefill-batch", 0, "requests per prefill batch (0: as the budget allows)");
  f.String("weight-dtype", "",
           "the instances' linear weights' dtype (bf16, f16, q8, q4, q4z: their bytes in memory and in each step's "
           "reads, a roofline latency built for them; also for --cluster instances without their own "
           "weight_dtype); empty: the model as given");
  f.Int("max-batch-size", 256, "requests per decode step");
  f.Int("cache-blocks", 0,
        "a prefix cache (the workers' knowledge tree) of this many device KV blocks in each prefill instance, for "
        "prompts with token ids (--lengths rag); 0: none");
  f.Int("cache-host-blocks", 0, "with --cache-blocks: its host tier, in blocks (0: none)");
  f.String("cache-policy", "pgdsf", "with --cache-blocks: replacement, pgdsf | gdsf | lru | lfu");
  f.Int("cache-block-size", 16, "with --cache-blocks: tokens per KV block");
  f.Double("host-link-gbps", 25, "with --cache-host-blocks: host -> device copy bandwidth, GB/s (PCIe 4 x16: 25)");
  AddLatencyFlags(f);
  AddWorkloadFlags(f, /*default_requests=*/10000);
  f.Double("slo-ttft", 1.0, "TTFT target, seconds");
  f.Double("slo-tpot", 0.1, "TPOT target, seconds");
  f.Double("target", 0.9, "attainment the goodput must keep (both targets met by this fraction)");
  f.String("rates", "", "simulate at these rates (comma-separated requests/s) instead of the workload's");
  f.Bool("goodput", "search the highest rate that keeps --target attainment (bisection)");
  f.String("csv", "", "write one row per request here (arrival, prefill start, first token, finish, output)");
  f.String("svg", "", "plot attainment against rate here (every cluster a series; needs --rates)");
  f.Bool("json", "print one JSON object per cluster and rate instead of the table");
  f.Bool("autoscale",
         "resize the pools as they serve, every --interval (the SLA planner's code against the simulator): the "
         "cluster given is the start, its first prefill and decode instances the shape of those started");
  f.String("autoscaler", "sla",
           "with --autoscale: sla (the SLA planner) | queue (HPA's formula on queued prompts per prefill and "
           "requests per decode instance, as KEDA setups scale)");
  f.Double("startup-delay", 60, "with --autoscale: seconds from a start decision to the instance serving");
  f.Double("switch-delay", 5, "with --autoscale --switch-roles: seconds from a drained instance to serving in its new role");
  AddPlannerFlags(f);
  f.Double("queue-prefill-bound", 4, "--autoscaler queue: queued prompts per prefill instance");
  f.Double("queue-decode-bound", 64, "--autoscaler queue: running or waiting requests per decode instance");
  f.Double("stabilization", 300, "--autoscaler queue: a pool shrinks to the largest recommendation of this many seconds");
  f.String("timeline", "", "with --autoscale: write one CSV row per decision here");
  f.Bool("log-decisions", "with --autoscale: print each SLA planner decision, its inputs and predictions");
}

// The latency models of instances on another GPU type or at another weight
// dtype, by latency spec and dtype.
using DTypeLatencies = std::map<std::string, std::unique_ptr<placement::LatencyModel>>;

absl::StatusOr<std::vector<std::pair<std::string, ClusterSpec>>> Clusters(const FlagSet& f, const ModelSpec& model,
                                                                        const std::string& latency_spec,
                                                                        DTypeLatencies& by_dtype) {
  std::vector<std::pair<std::string, ClusterSpec>> out;
  auto capacity = [&](const std::string& gpu_id, const placement::Parallel& par,
                      const ModelSpec& m) -> absl::StatusOr<double> {
    if (f.GetDouble("kv-capacity-tokens") > 0) return f.GetDouble("kv-capacity-tokens");
    ASSIGN_OR_RETURN(placement::GpuSpec g, placement::LoadGpu(gpu_id));
    const double tokens = placement::KvCapacity(m, g, par);
    if (tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(m.name, m.weight_dtype.empty() ? "" : " in ", m.weight_dtype,
                                                     " does not fit on ", par.gpus(), " x ", g.name, " (weights ",
                                                     m.WeightBytes() / 1e9, " GB)"));
    }
    return tokens;
  };
  auto link = [&](const std::string& gpu_id, double cluster_gbps) -> absl::StatusOr<double> {
    if (f.GetDouble("link-gbps") > 0) return f.GetDouble("link-gbps") * 1e9;
    if (cluster_gbps > 0) return cluster_gbps * 1e9;
    ASSIGN_OR_RETURN(placement::GpuSpec g, placement::LoadGpu(gpu_id));
    return g.intra_node_bw;
  };
  auto common = [&](ClusterSpec& c) {
    c.policy = f.GetString("policy");
    c.cache_aware_weights = ParseCacheAwareWeights(f.GetString("cache-aware-weights")).value();  // checked above
    c.interference_prefill = f.GetDouble("interference-prefill");
    c.interference_decode = f.GetDouble("interference-decode");
    c.chunked_prefill = f.GetBool("chunked-prefill");
    c.chunk_tokens = f.GetInt("chunk-tokens");
  };
  auto instance = [&](InstanceRole role, int tp, int pp, const std::string& gpu, int64_t max_batch_tokens,
                      const std::string& dtype) -> absl::StatusOr<InstanceSpec> {
    InstanceSpec s;
    s.role = role;
    s.par = {.tp = tp, .pp = pp};
    ModelSpec m = model;
    if (!dtype.empty()) {
      ASSIGN_OR_RETURN(m, placement::AtWeightDType(model, dtype));
    }
    // An instance on another GPU type than --gpu is timed by its own
    // roofline (unless --latency names the model), one of another weight
    // dtype by the latency model built for that dtype.
    const bool own_gpu = f.GetString("latency").empty() && gpu != f.GetString("gpu");
    if (own_gpu || !dtype.empty()) {
      const std::string spec = own_gpu ? absl::StrCat("roofline:", gpu) : latency_spec;
      std::unique_ptr<placement::LatencyModel>& l = by_dtype[absl::StrCat(spec, " ", dtype)];
      if (l == nullptr) {
        ASSIGN_OR_RETURN(l, LoadLatencyForWeights(f, spec, model, m, LatencySeed(f)));
      }
      s.latency = l.get();
    }
    ASSIGN_OR_RETURN(s.kv_capacity_tokens, capacity(gpu, s.par, m));
    s.max_batch_tokens = max_batch_tokens;
    s.max_prefill_batch = f.GetInt("max-prefill-batch");
    s.max_batch_size = f.GetInt("max-batch-size");
    return s;
  };
  if (!f.GetString("cluster").empty()) {
    for (absl::string_view path : absl::StrSplit(f.GetString("cluster"), ',', absl::SkipEmpty())) {
      ASSIGN_OR_RETURN(placement::ClusterConfig cfg, placement::LoadClusterConfig(std::string(path), /*for_simulation=*/true));
      ClusterSpec c;
      common(c);
      std::string gpu = f.GetString("gpu");
      for (const placement::InstanceConfig& ic : cfg.instances) {
        const std::string g = ic.gpu.empty() ? f.GetString("gpu") : ic.gpu;
        gpu = g;
        const InstanceRole role = ic.role == "prefill"  ? InstanceRole::kPrefill
                                  : ic.role == "decode" ? InstanceRole::kDecode
                                                        : InstanceRole::kColocated;
        // An instance without its own budget takes --max-batch-tokens.
        ASSIGN_OR_RETURN(InstanceSpec s, instance(role, ic.tp, ic.pp, g,
                                                  ic.max_batch_tokens > 0 ? ic.max_batch_tokens
                                                                          : f.GetInt("max-batch-tokens"),
                                                  ic.weight_dtype.empty() ? f.GetString("weight-dtype")
                                                                          : ic.weight_dtype));
        c.instances.push_back(s);
      }
      ASSIGN_OR_RETURN(c.kv_link_bytes_per_s, link(gpu, cfg.kv_link_gbps));
      out.push_back({std::string(path), std::move(c)});
    }
    return out;
  }
  ClusterSpec c;
  common(c);
  const int tp = static_cast<int>(f.GetInt("tp")), pp = static_cast<int>(f.GetInt("pp"));
  if (tp < 1 || pp < 1) return absl::InvalidArgumentError("--tp and --pp must be >= 1");
  const std::string gpu = f.GetString("gpu");
  std::string name;
  if (f.GetInt("colocated") > 0) {
    for (int64_t i = 0; i < f.GetInt("colocated"); ++i) {
      ASSIGN_OR_RETURN(InstanceSpec s, instance(InstanceRole::kColocated, tp, pp, gpu, f.GetInt("max-batch-tokens"), f.GetString("weight-dtype")));
      c.instances.push_back(s);
    }
    name = absl::StrCat(f.GetInt("colocated"), " colocated (tp ", tp, ", pp ", pp, ")");
  } else {
    if (f.GetInt("prefill") < 1 || f.GetInt("decode") < 0) {
      return absl::InvalidArgumentError("need --prefill >= 1 and --decode >= 0 (or --colocated)");
    }
    for (int64_t i = 0; i < f.GetInt("prefill"); ++i) {
      ASSIGN_OR_RETURN(InstanceSpec s, instance(InstanceRole::kPrefill, tp, pp, gpu, f.GetInt("max-batch-tokens"), f.GetString("weight-dtype")));
      c.instances.push_back(s);
    }
    for (int64_t i = 0; i < f.GetInt("decode"); ++i) {
      ASSIGN_OR_RETURN(InstanceSpec s, instance(InstanceRole::kDecode, tp, pp, gpu, f.GetInt("max-batch-tokens"), f.GetString("weight-dtype")));
      c.instances.push_back(s);
    }
    name = absl::StrCat(f.GetInt("prefill"), " prefill + ", f.GetInt("decode"), " decode (tp ", tp, ", pp ", pp, ")");
  }
  if (f.GetDouble("kv-capacity-tokens") <= 0 && f.GetString("latency").rfind("constant:", 0) == 0) {
    for (InstanceSpec& s : c.instances) s.kv_capacity_tokens = 0;  // a queueing check: no memory limit
  }
  ASSIGN_OR_RETURN(c.kv_link_bytes_per_s, link(gpu, 0));
  out.push_back({name, std::move(c)});
  return out;
}

std::string Svg(const std::vector<std::string>& names, const std::vector<double>& rates,
                const std::vector<std::vector<double>>& attain, double target) {
  const double w = 640, h = 400, l = 60, r = 20, t = 20, b = 50;
  const double xmax = rates.empty() ? 1 : *std::max_element(rates.begin(), rates.end());
  auto X = [&](double x) { return l + (w - l - r) * x / (xmax > 0 ? xmax : 1); };
  auto Y = [&](double y) { return t + (h - t - b) * (1 - y); };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      w, h);
  absl::StrAppendFormat(&s, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", l, Y(0), w - r, Y(0));
  absl::StrAppendFormat(&s, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", l, Y(0), l, Y(1));
  for (double y : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%g%%</text>\n", l - 6, Y(y) + 4, y * 100);
  }
  absl::StrAppendFormat(&s, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"gray\" stroke-dasharray=\"4\"/>\n", l,
                        Y(target), w - r, Y(target));
  for (double x : rates) {
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%g</text>\n", X(x), Y(0) + 16, x);
  }
  absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">rate (requests/s)</text>\n",
                        (l + w - r) / 2, h - 8);
  for (size_t k = 0; k < names.size(); ++k) {
    std::string pts;
    for (size_t i = 0; i < rates.size(); ++i) absl::StrAppendFormat(&pts, "%g,%g ", X(rates[i]), Y(attain[k][i]));
    absl::StrAppendFormat(&s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n",
                          kColors[k % 6], pts);
    absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", l + 10, t + 14 + 14 * k,
                          kColors[k % 6], names[k]);
  }
  s += "</svg>\n";
  return s;
}

// A flag the chosen mode ignores is refused, naming it.
absl::Status CheckSimFlags(const FlagSet& f) {
  RETURN_IF_ERROR(CheckWorkloadFlags(f));
  const bool cluster_files = !f.GetString("cluster").empty();
  RETURN_IF_ERROR(f.RefuseUnless(!cluster_files, {"prefill", "decode", "colocated", "tp", "pp"},
                                 "with --cluster (the cluster files say their instances)"));
  const bool colocated = !cluster_files && f.GetInt("colocated") > 0;
  const bool disaggregated = !cluster_files && !colocated;
  RETURN_IF_ERROR(f.RefuseUnless(!colocated, {"prefill", "decode", "link-gbps", "max-prefill-batch"},
                                 "with --colocated"));
  RETURN_IF_ERROR(f.RefuseUnless(!disaggregated, {"chunked-prefill", "chunk-tokens"},
                                 "without colocated instances"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetBool("chunked-prefill"), {"chunk-tokens"},
                                 "without --chunked-prefill"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetBool("goodput") || !f.GetString("svg").empty(), {"target"},
                                 "without --goodput or --svg"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetString("rates").empty(), {"rate", "rate-scale"},
                                 "with --rates (the workload is rescaled to each rate)"));
  if (!f.GetString("svg").empty() && f.GetString("rates").empty()) return absl::InvalidArgumentError("--svg needs --rates");
  RETURN_IF_ERROR(f.RefuseUnless(f.GetInt("cache-blocks") > 0,
                                 {"cache-host-blocks", "cache-policy", "cache-block-size", "host-link-gbps"},
                                 "without --cache-blocks"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetInt("cache-host-blocks") > 0, {"host-link-gbps"}, "without --cache-host-blocks"));
  const std::string policy = f.GetString("policy");
  RETURN_IF_ERROR(dispatch::ParseDispatchPolicy(policy).status());
  if (policy == "cache_aware" && f.GetInt("cache-blocks") <= 0) {
    return absl::InvalidArgumentError("--policy cache_aware needs --cache-blocks (the caches it reads)");
  }
  RETURN_IF_ERROR(f.RefuseUnless(policy == "cache_aware", {"cache-aware-weights"}, "unless --policy cache_aware"));
  RETURN_IF_ERROR(ParseCacheAwareWeights(f.GetString("cache-aware-weights")).status());
  const bool autoscale = f.GetBool("autoscale");
  RETURN_IF_ERROR(f.RefuseUnless(
      autoscale,
      {"autoscaler", "startup-delay", "switch-delay", "interval", "burst-check", "planner-target", "margin", "cooldown",
       "decode-utilization", "forecast", "min-prefill", "max-prefill", "min-decode", "max-decode", "max-instances",
       "switch-roles", "queue-prefill-bound", "queue-decode-bound", "stabilization", "timeline", "log-decisions"},
      "without --autoscale"));
  if (autoscale) {
    RETURN_IF_ERROR(f.RefuseUnless(false, {"rates", "goodput", "svg", "colocated", "chunked-prefill"},
                                   "with --autoscale (one run of prefill and decode pools)"));
    if (f.GetString("autoscaler") != "sla" && f.GetString("autoscaler") != "queue") {
      return absl::InvalidArgumentError("--autoscaler must be sla or queue");
    }
    const bool sla = f.GetString("autoscaler") == "sla";
    RETURN_IF_ERROR(f.RefuseUnless(sla, {"burst-check", "planner-target", "margin", "cooldown", "decode-utilization", "forecast",
                                         "switch-roles", "log-decisions"},
                                   "with --autoscaler queue"));
    RETURN_IF_ERROR(f.RefuseUnless(!sla, {"queue-prefill-bound", "queue-decode-bound", "stabilization"},
                                   "with --autoscaler sla"));
    RETURN_IF_ERROR(f.RefuseUnless(f.GetBool("switch-roles"), {"switch-delay"}, "without --switch-roles"));
    if (!(f.GetDouble("startup-delay") >= 0) || !(f.GetDouble("switch-delay") >= 0)) {
      return absl::InvalidArgumentError("--startup-delay and --switch-delay must be >= 0");
    }
    if (!(f.GetDouble("queue-prefill-bound") > 0) || !(f.GetDouble("queue-decode-bound") > 0) ||
        !(f.GetDouble("stabilization") >= 0)) {
      return absl::InvalidArgumentError("the queue bounds must be positive and --stabilization >= 0");
    }
  }
  RETURN_IF_ERROR(f.RefuseUnless(!colocated, {"cache-blocks"}, "with --colocated (the cache is simulated in prefill "
                                                               "instances)"));
  return absl::OkStatus();
}

// The prefix cache every prefill instance of the clusters gets.
absl::StatusOr<placement::PrefixCacheSpec> CacheFromFlags(const FlagSet& f) {
  placement::PrefixCacheSpec c;
  c.device_blocks = f.GetInt("cache-blocks");
  c.host_blocks = f.GetInt("cache-host-blocks");
  c.block_size = f.GetInt("cache-block-size");
  c.host_link_bytes_per_s = f.GetDouble("host-link-gbps") * 1e9;
  if (c.device_blocks < 0 || c.host_blocks < 0 || c.block_size < 1 || !(c.host_link_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        "--cache-blocks and --cache-host-blocks must be >= 0, --cache-block-size >= 1, --host-link-gbps > 0");
  }
  ASSIGN_OR_RETURN(c.policy, kvcache::ParsePolicy(f.GetString("cache-policy")));
  return c;
}

// --autoscale: one run, the pools resized by the SLA planner or the queue
// autoscaler as the simulated cluster serves.
absl::Status RunAutoscaled(const FlagSet& f, const ModelSpec& model, placement::LatencyModel& latency,
                           const placement::Workload& w,
                           const std::vector<std::pair<std::string, ClusterSpec>>& clusters) {
  if (clusters.size() != 1) return absl::InvalidArgumentError("--autoscale runs one cluster");
  const ClusterSpec& start = clusters[0].second;
  placement::AutoscaleOptions a;
  bool have_prefill = false, have_decode = false;
  for (const InstanceSpec& s : start.instances) {
    if (s.role == InstanceRole::kColocated) {
      return absl::InvalidArgumentError("--autoscale resizes prefill and decode pools; the cluster has colocated instances");
    }
    InstanceSpec& shape = s.role == InstanceRole::kPrefill ? a.prefill : a.decode;
    bool& have = s.role == InstanceRole::kPrefill ? have_prefill : have_decode;
    if (!have) shape = s, have = true;
  }
  if (!have_prefill || !have_decode) {
    return absl::InvalidArgumentError("--autoscale needs a prefill and a decode instance to start from");
  }
  a.interval_s = f.GetDouble("interval");
  a.check_s = f.GetDouble("burst-check");
  a.startup_s = f.GetDouble("startup-delay");
  a.switch_s = f.GetDouble("switch-delay");
  ASSIGN_OR_RETURN(placement::PlannerOptions po, PlannerFromFlags(f));
  po.prefill = a.prefill;
  po.decode = a.decode;
  po.cluster = start;
  po.cluster.instances.clear();
  po.seed = static_cast<uint64_t>(f.GetInt("seed"));
  std::unique_ptr<placement::Autoscaler> scaler;
  std::string name;
  if (f.GetString("autoscaler") == "sla") {
    if (f.GetBool("log-decisions")) {
      po.on_decision = [](const placement::PlannerRecord& r, const placement::LoadFigures&) {
        std::printf("planner: %s\n", r.Describe().c_str());
      };
    }
    scaler = std::make_unique<placement::Planner>(model, latency, po);
    name = "SLA planner";
  } else {
    scaler = std::make_unique<placement::QueueThresholdScaler>(
        placement::QueueThresholdOptions{.prefill_bound = f.GetDouble("queue-prefill-bound"),
                                         .decode_bound = f.GetDouble("queue-decode-bound"),
                                         .min_prefill = po.min_prefill,
                                         .max_prefill = po.max_prefill,
                                         .min_decode = po.min_decode,
                                         .max_decode = po.max_decode,
                                         .max_instances = po.max_instances,
                                         .stabilization_s = f.GetDouble("stabilization")});
    name = "queue threshold";
  }
  a.scaler = scaler.get();
  const auto t0 = std::chrono::steady_clock::now();
  const placement::SimResult r = placement::SimulateAutoscaled(start, model, latency, w.requests, a);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const placement::Slo slo = po.slo;
  const double fixed_gpu_hours = start.gpus() * r.makespan / 3600;
  int most = 0;
  for (const placement::FleetSample& x : r.timeline) most = std::max(most, x.gpus);
  std::printf("duet sim --autoscale (%s): %s, %s; %zu requests over %.0f s, SLO TTFT %.3g s, TPOT %.3g s; "
              "start-up %.0f s, interval %.0f s\n",
              name.c_str(), model.name.c_str(), latency.Describe().c_str(), w.requests.size(), r.makespan, slo.ttft,
              slo.tpot, a.startup_s, a.interval_s);
  std::printf("attainment %.4f (TTFT %.4f, TPOT %.4f); TTFT p50 %.4f s p99 %.4f s; TPOT p50 %.4f s p99 %.4f s\n",
              r.Attainment(slo), r.TtftAttainment(slo.ttft), r.TpotAttainment(slo.tpot), r.Percentile(0.5, false),
              r.Percentile(0.99, false), r.Percentile(0.5, true), r.Percentile(0.99, true));
  std::printf("GPU-hours %.2f (the starting cluster held throughout: %.2f; at most %d GPUs at once); %lld started, "
              "%lld drained, %lld switched; %zu decisions; %.2f s\n",
              r.gpu_seconds / 3600, fixed_gpu_hours, most, static_cast<long long>(r.started),
              static_cast<long long>(r.drained), static_cast<long long>(r.switched), r.timeline.size(), wall);
  if (!f.GetString("timeline").empty()) {
    std::ofstream out(f.GetString("timeline"));
    out << "t,prefill,decode,prefill_ready,decode_ready,gpus,arrival_rate\n";
    for (const placement::FleetSample& x : r.timeline) {
      out << x.t << ',' << x.prefill << ',' << x.decode << ',' << x.prefill_ready << ',' << x.decode_ready << ','
          << x.gpus << ',' << x.arrival_rate << '\n';
    }
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", f.GetString("timeline")));
  }
  return absl::OkStatus();
}

absl::Status Run(const FlagSet& f) {
  RETURN_IF_ERROR(CheckSimFlags(f));
  ASSIGN_OR_RETURN(ModelSpec model, placement::LoadModelSpec(f.GetString("model")));
  const std::string latency_spec =
      f.GetString("latency").empty() ? absl::StrCat("roofline:", f.GetString("gpu")) : f.GetString("latency");
  ASSIGN_OR_RETURN(std::unique_ptr<placement::LatencyModel> latency,
                   LoadLatencyWithOverhead(f, latency_spec, model, LatencySeed(f)));
  const placement::WorkloadOptions wo = WorkloadFromFlags(f, model);
  ASSIGN_OR_RETURN(placement::Workload w, placement::MakeWorkload(wo));
  if (w.requests.empty()) return absl::InvalidArgumentError("the workload has no requests (all dropped as overlong?)");
  DTypeLatencies by_dtype;
  ASSIGN_OR_RETURN(auto clusters, Clusters(f, model, latency_spec, by_dtype));
  ASSIGN_OR_RETURN(const placement::PrefixCacheSpec cache, CacheFromFlags(f));
  for (auto& [name, c] : clusters) c.cache = cache;
  for (const auto& [name, c] : clusters) {
    for (const InstanceSpec& s : c.instances) {
      if (!latency->Supports(s.par)) {
        return absl::InvalidArgumentError(absl::StrCat(latency->Describe(), " has no entry for TP ", s.par.tp,
                                                       " (cluster ", name, ")"));
      }
    }
  }
  if (f.GetBool("autoscale")) return RunAutoscaled(f, model, *latency, w, clusters);
  std::vector<double> rates;
  for (absl::string_view r : absl::StrSplit(f.GetString("rates"), ',', absl::SkipEmpty())) {
    double x = 0;
    if (!absl::SimpleAtod(r, &x) || !(x > 0)) return absl::InvalidArgumentError(absl::StrCat("bad rate '", r, "'"));
    rates.push_back(x);
  }
  const placement::Slo slo{.ttft = f.GetDouble("slo-ttft"), .tpot = f.GetDouble("slo-tpot")};
  const bool json = f.GetBool("json");
  if (!json) {
    std::printf("duet sim: %s, %s; %zu requests (%lld dropped, %lld truncated as longer than %lld tokens), base rate "
                "%.3f/s; SLO TTFT %.3g s, TPOT %.3g s\n",
                model.name.c_str(), latency->Describe().c_str(), w.requests.size(), static_cast<long long>(w.dropped),
                static_cast<long long>(w.truncated), static_cast<long long>(model.max_context),
                placement::MeanRate(w.requests), slo.ttft, slo.tpot);
    std::printf("%-36s %9s %9s %9s %9s %9s %9s %7s %7s %7s %12s %26s %8s\n", "cluster", "rate/s", "TTFT p50", "p90",
                "p99", "TPOT p50", "p99", "attain", "ttft", "tpot", "wait mean s", "wait 99% CI (batch means)",
                "wall s");
  }
  std::vector<std::string> names;
  std::vector<std::vector<double>> curves;
  for (const auto& [name, c] : clusters) {
    names.push_back(name);
    curves.emplace_back();
    std::vector<double> run_rates = rates.empty() ? std::vector<double>{placement::MeanRate(w.requests)} : rates;
    for (double rate : run_rates) {
      const auto reqs = rates.empty() ? w.requests : placement::AtRate(w.requests, rate);
      const auto start = std::chrono::steady_clock::now();
      placement::SimResult r = placement::Simulate(c, model, *latency, reqs);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const auto ci = r.QueueWaitBatchMeans();
      double ttft_sum = 0;
      for (const placement::RequestOutcome& o : r.requests) ttft_sum += o.ttft();
      const double ttft_mean = r.requests.empty() ? 0 : ttft_sum / static_cast<double>(r.requests.size());
      const double attain = r.Attainment(slo);
      curves.back().push_back(attain);
      if (json) {
        nlohmann::json j = {{"cluster", name},
                            {"gpus", c.gpus()},
                            {"rate", rate},
                            {"requests", r.requests.size()},
                            {"dropped", w.dropped},
                            {"truncated", w.truncated},
                            {"ttft_mean", ttft_mean},
                            {"ttft_p50", r.Percentile(0.5, false)},
                            {"ttft_p90", r.Percentile(0.9, false)},
                            {"ttft_p99", r.Percentile(0.99, false)},
                            {"tpot_p50", r.Percentile(0.5, true)},
                            {"tpot_p90", r.Percentile(0.9, true)},
                            {"tpot_p99", r.Percentile(0.99, true)},
                            {"attainment", attain},
                            {"ttft_attainment", r.TtftAttainment(slo.ttft)},
                            {"tpot_attainment", r.TpotAttainment(slo.tpot)},
                            {"queue_wait_mean", ci.mean},
                            {"queue_wait_ci99", {ci.lo, ci.hi}},
                            {"events", r.events},
                            {"wall_seconds", wall}};
        if (cache.device_blocks > 0) {
          j["cache_hit_rate"] = r.cache.hit_rate();
          j["cache_doc_hit_rate"] = r.cache.doc_hit_rate();
          j["cache_hit_device_tokens"] = r.cache.hit_device;
          j["cache_hit_host_tokens"] = r.cache.hit_host;
          j["cache_query_tokens"] = r.cache.query_tokens;
          j["cache_swap_in_blocks"] = r.cache.swap_in_blocks;
        }
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-36s %9.3f %9.4f %9.4f %9.4f %9.4f %9.4f %7.3f %7.3f %7.3f %12.5g %12.5g..%-12.5g %8.3f\n",
                    name.substr(0, 36).c_str(), rate, r.Percentile(0.5, false), r.Percentile(0.9, false),
                    r.Percentile(0.99, false), r.Percentile(0.5, true), r.Percentile(0.99, true), attain,
                    r.TtftAttainment(slo.ttft), r.TpotAttainment(slo.tpot), ci.mean, ci.lo, ci.hi, wall);
        if (cache.device_blocks > 0) {
          std::printf("  prefix cache (%s, %lld + %lld blocks per prefill): %.1f%% of prompt tokens reused (%.1f%% "
                      "from device, %.1f%% from host), %.1f%% of document tokens\n",
                      kvcache::PolicyName(cache.policy), static_cast<long long>(cache.device_blocks),
                      static_cast<long long>(cache.host_blocks), 100 * r.cache.hit_rate(),
                      r.cache.query_tokens > 0 ? 100.0 * r.cache.hit_device / r.cache.query_tokens : 0.0,
                      r.cache.query_tokens > 0 ? 100.0 * r.cache.hit_host / r.cache.query_tokens : 0.0,
                      100 * r.cache.doc_hit_rate());
        }
      }
      if (!f.GetString("csv").empty()) {
        std::ofstream out(f.GetString("csv"), clusters.size() > 1 || run_rates.size() > 1 ? std::ios::app : std::ios::trunc);
        out.precision(17);  // Full precision: at t = 1234 s, 6 digits would leave milliseconds.
        out << "cluster,rate,arrival,prefill_start,first_token,finish,output\n";
        for (const placement::RequestOutcome& o : r.requests) {
          out << '"' << name << "\"," << rate << ',' << o.arrival << ',' << o.prefill_start << ',' << o.first_token
              << ',' << o.finish << ',' << o.output << '\n';
        }
      }
    }
    if (f.GetBool("goodput")) {
      const auto start = std::chrono::steady_clock::now();
      placement::Goodput g = placement::FindGoodput(c, model, *latency, w.requests, slo, f.GetDouble("target"));
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (json) {
        std::printf("%s\n", nlohmann::json({{"cluster", name},
                                             {"goodput_rate", g.rate},
                                             {"goodput_per_gpu", g.per_gpu},
                                             {"attainment", g.attainment},
                                             {"simulations", g.simulations},
                                             {"wall_seconds", wall}})
                                .dump()
                                .c_str());
      } else {
        std::printf("goodput of %s: %.4f requests/s (%.4f per GPU, %d GPUs) at %.1f%% attainment; %d simulations, "
                    "%.2f s\n",
                    name.c_str(), g.rate, g.per_gpu, c.gpus(), g.attainment * 100, g.simulations, wall);
      }
    }
  }
  if (!f.GetString("svg").empty()) {
    std::ofstream(f.GetString("svg")) << Svg(names, rates, curves, f.GetDouble("target"));
  }
  return absl::OkStatus();
}

}  // namespace

int RunSim(int argc, char** argv) {
  FlagSet f("duet sim",
            "Simulates a cluster serving a workload (no GPU, no weights): per-request TTFT and TPOT, SLO "
            "attainment, the mean queue wait with a 99% batch-means confidence interval, and optionally the "
            "goodput (--goodput), per-request CSV (--csv) and an attainment-vs-rate plot (--svg); with "
            "--autoscale, the pools resized as they serve by the SLA planner (or a queue-threshold autoscaler), "
            "with attainment and GPU-hours.");
  AddSimFlags(f);
  return RunWithFlags(f, argc, argv, Run);
}

}  // namespace duet::tools

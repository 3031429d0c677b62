// duet place: the placement search (placement/place.h) from the command line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "base/serving_defaults.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/workload.h"
#include "tools/commands.h"
#include "tools/workload_flags.h"

namespace duet::tools {
namespace {

// A flag the search ignores is refused, naming it.
absl::Status CheckPlaceFlags(const FlagSet& f) {
  RETURN_IF_ERROR(CheckWorkloadFlags(f));
  RETURN_IF_ERROR(f.RefuseUnless(false, {"rate", "rate-scale"},
                                 "in duet place (its search rescales the workload's arrivals to each rate)"));
  RETURN_IF_ERROR(f.RefuseUnless(!f.GetString("gpu2").empty(), {"nodes2", "gpus-per-node2", "latency2"},
                                 "without --gpu2"));
  RETURN_IF_ERROR(f.RefuseUnless(!f.GetBool("exhaustive"), {"verify"},
                                 "with --exhaustive (every candidate is simulated whole)"));
  RETURN_IF_ERROR(f.RefuseUnless(!f.GetBool("json"), {"top"}, "with --json (it prints the plan alone)"));
  RETURN_IF_ERROR(f.RefuseUnless(!f.GetString("precision").empty(), {"precision-sensitivity", "max-sensitivity"},
                                 "without --precision"));
  RETURN_IF_ERROR(f.RefuseUnless(f.GetString("precision").empty(), {"colocated-latency"},
                                 "with --precision (each precision's roofline times its colocated instances)"));
  return absl::OkStatus();
}

// --precision-sensitivity: "bf16=0,q8=0.004,q4=0.05", or a `duet
// precision-plan` map file, whose measured sensitivities (each layer alone
// in each dtype) sum to each uniform dtype's.
absl::StatusOr<std::map<std::string, double>> ParseSensitivities(const std::string& arg) {
  std::map<std::string, double> out;
  if (arg.find('=') != std::string::npos) {
    for (absl::string_view part : absl::StrSplit(arg, ',', absl::SkipWhitespace())) {
      std::vector<std::string> kv = absl::StrSplit(part, '=');
      double v = 0;
      if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--precision-sensitivity: DTYPE=VALUE,... with non-negative values; got \"", part, "\""));
      }
      out[kv[0]] = v;
    }
    return out;
  }
  std::ifstream in(arg);
  if (!in) return absl::NotFoundError(absl::StrCat("--precision-sensitivity ", arg, ": cannot open"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("plan") || !j["plan"].contains("sensitivity") ||
      !j["plan"]["sensitivity"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision-sensitivity ", arg, ": not a duet precision-plan map (no plan.sensitivity)"));
  }
  for (const auto& [dtype, column] : j["plan"]["sensitivity"].items()) {
    double sum = 0;
    for (const auto& v : column) sum += v.get<double>();
    out[dtype] = sum;
  }
  return out;
}

absl::Status Run(const FlagSet& f) {
  RETURN_IF_ERROR(CheckPlaceFlags(f));
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(placement::ModelSpec model, placement::LoadModelSpec(f.GetString("model")));
  ASSIGN_OR_RETURN(placement::GpuSpec gpu, placement::LoadGpu(f.GetString("gpu")));
  const std::string spec = f.GetString("latency").empty() ? absl::StrCat("roofline:", gpu.id) : f.GetString("latency");
  ASSIGN_OR_RETURN(auto latency, LoadLatencyWithOverhead(f, spec, model, LatencySeed(f)));
  std::unique_ptr<placement::LatencyModel> coloc_latency;
  if (!f.GetString("colocated-latency").empty()) {
    ASSIGN_OR_RETURN(coloc_latency, LoadLatencyWithOverhead(f, f.GetString("colocated-latency"), model,
                                                            static_cast<uint64_t>(f.GetInt("seed")) ^ 0x51ed));
  }
  const placement::WorkloadOptions wo = WorkloadFromFlags(f, model);
  ASSIGN_OR_RETURN(placement::Workload w, placement::MakeWorkload(wo));
  if (w.requests.empty()) return absl::InvalidArgumentError("the workload has no requests");
  placement::PlaceOptions o;
  o.nodes = static_cast<int>(f.GetInt("nodes"));
  o.gpus_per_node = static_cast<int>(f.GetInt("gpus-per-node"));
  o.affinity = f.GetString("affinity");
  o.slo = {.ttft = f.GetDouble("slo-ttft"), .tpot = f.GetDouble("slo-tpot")};
  o.target = f.GetDouble("target");
  o.max_pp = static_cast<int>(f.GetInt("max-pp"));
  o.verify = static_cast<int>(f.GetInt("verify"));
  o.exhaustive = f.GetBool("exhaustive");
  o.max_batch_tokens = f.GetInt("max-batch-tokens");
  placement::GpuSpec gpu2;
  std::unique_ptr<placement::LatencyModel> latency2;
  std::string spec2;
  if (!f.GetString("gpu2").empty()) {
    ASSIGN_OR_RETURN(gpu2, placement::LoadGpu(f.GetString("gpu2")));
    spec2 = f.GetString("latency2").empty() ? absl::StrCat("roofline:", gpu2.id) : f.GetString("latency2");
    ASSIGN_OR_RETURN(latency2, LoadLatencyWithOverhead(f, spec2, model, static_cast<uint64_t>(f.GetInt("seed")) ^ 0x2));
    o.second_gpu = &gpu2;
    o.second_latency = latency2.get();
    o.second_nodes = static_cast<int>(f.GetInt("nodes2"));
    o.second_gpus_per_node = static_cast<int>(f.GetInt("gpus-per-node2"));
  }
  // Precision: each candidate dtype's model, timed by each pool's latency
  // model built for it.
  std::vector<std::unique_ptr<placement::LatencyModel>> precision_latency;
  if (!f.GetString("precision").empty()) {
    const std::string list = f.GetString("precision") == "auto" ? "bf16,q8,q4" : f.GetString("precision");
    if (f.GetString("precision-sensitivity").empty()) {
      return absl::InvalidArgumentError(
          "--precision needs --precision-sensitivity (DTYPE=VALUE,... or a duet precision-plan map file)");
    }
    ASSIGN_OR_RETURN(const auto sens, ParseSensitivities(f.GetString("precision-sensitivity")));
    o.max_sensitivity = f.GetDouble("max-sensitivity");
    for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      placement::PrecisionChoice pc;
      pc.dtype = std::string(name);
      ASSIGN_OR_RETURN(pc.model, placement::AtWeightDType(model, pc.dtype));
      auto it = sens.find(pc.dtype);
      if (it == sens.end()) {
        return absl::InvalidArgumentError(absl::StrCat("--precision-sensitivity gives no value for ", pc.dtype));
      }
      pc.sensitivity = it->second;
      const std::vector<std::string> specs = {spec, spec2};
      for (size_t k = 0; k < (o.second_gpu != nullptr ? 2u : 1u); ++k) {
        ASSIGN_OR_RETURN(auto l, LoadLatencyForWeights(f, specs[k], model, pc.model, LatencySeed(f) ^ (0x9 + k)));
        pc.latency.push_back(l.get());
        precision_latency.push_back(std::move(l));
      }
      o.precisions.push_back(std::move(pc));
    }
  }
  std::fprintf(stderr, "[duet place] %s on %d x %d %s, %zu requests, searching...\n", model.name.c_str(), o.nodes,
               o.gpus_per_node, gpu.name.c_str(), w.requests.size());
  ASSIGN_OR_RETURN(placement::PlaceResult r,
                   placement::Place(model, gpu, *latency, w.requests, o, coloc_latency.get()));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r.disaggregated.empty() || r.colocated.empty()) return absl::NotFoundError("no placement fits");
  const placement::Plan& best = r.disaggregated.front();
  const placement::Plan& coloc = r.colocated.front();
  if (best.goodput.rate <= 0 && coloc.goodput.rate <= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no plan keeps %.0f%% of requests within TTFT %.3g s and TPOT %.3g s at any rate down to 1/1000 of the "
        "workload's (%d candidates, %d simulations): the targets are tighter than the workload's requests take "
        "alone on the largest shape; loosen --slo-ttft / --slo-tpot or --target",
        o.target * 100, o.slo.ttft, o.slo.tpot, r.candidates, r.simulations));
  }
  const double ratio = coloc.goodput.per_gpu > 0 ? best.goodput.per_gpu / coloc.goodput.per_gpu : 0;
  if (f.GetBool("json")) {
    auto plan = [](const placement::Plan& p) {
      return nlohmann::json{{"plan", p.Describe()},
                            {"prefill_pool", p.prefill_pool + 1},
                            {"decode_pool", p.decode_pool + 1},
                            {"prefill_dtype", p.prefill_dtype},
                            {"decode_dtype", p.decode_dtype},
                            {"sensitivity", p.sensitivity},
                            {"prefill_tp", p.prefill.par.tp},
                            {"prefill_pp", p.prefill.par.pp},
                            {"prefill_count", p.prefill.count},
                            {"decode_tp", p.decode.par.tp},
                            {"decode_pp", p.decode.par.pp},
                            {"decode_count", p.decode.count},
                            {"gpus", p.gpus},
                            {"goodput", p.goodput.rate},
                            {"goodput_per_gpu", p.goodput.per_gpu}};
    };
    nlohmann::json j = {{"disaggregated", plan(best)},      {"colocated", plan(coloc)},
                        {"ratio", ratio},                   {"candidates", r.candidates},
                        {"simulations", r.simulations},     {"wall_seconds", wall},
                        {"requests", w.requests.size()},    {"base_rate", placement::MeanRate(w.requests)}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("duet place: %s on %d node(s) x %d %s%s (%s node-affinity), %s%s; SLO TTFT %.3g s and TPOT %.3g s "
                "at %.0f%%; %zu requests\n\n",
                model.name.c_str(), o.nodes, o.gpus_per_node, gpu.name.c_str(),
                o.second_gpu != nullptr
                    ? absl::StrCat(" (pool 1) and ", o.second_nodes, " x ", o.second_gpus_per_node, " ",
                                   o.second_gpu->name, " (pool 2, ", latency2->Describe(), ")")
                          .c_str()
                    : "",
                o.affinity.c_str(), latency->Describe().c_str(),
                coloc_latency ? absl::StrCat(" (colocated: ", coloc_latency->Describe(), ")").c_str() : "", o.slo.ttft,
                o.slo.tpot, o.target * 100, w.requests.size());
    if (!o.precisions.empty()) {
      std::string line;
      for (const placement::PrecisionChoice& pc : o.precisions) {
        absl::StrAppendFormat(&line, "%s%s (sensitivity %.3g%s, weights %.1f GB)", line.empty() ? "" : ", ",
                              pc.dtype, pc.sensitivity, pc.sensitivity > o.max_sensitivity ? ", over the bound" : "",
                              pc.model.WeightBytes() / 1e9);
      }
      std::printf("precision:  %s; bound %g; a plan's sensitivity is its roles' larger\n", line.c_str(),
                  o.max_sensitivity);
    }
    std::printf("plan:       %s on %d GPUs: %.4f requests/s, %.4f per GPU%s\n", best.Describe().c_str(), best.gpus,
                best.goodput.rate, best.goodput.per_gpu,
                o.precisions.empty() ? "" : absl::StrFormat(", sensitivity %.3g", best.sensitivity).c_str());
    std::printf("colocated:  %s on %d GPUs: %.4f requests/s, %.4f per GPU\n", coloc.Describe().c_str(), coloc.gpus,
                coloc.goodput.rate, coloc.goodput.per_gpu);
    std::printf("ratio:      %.2fx per GPU, disaggregated over colocated\n\n", ratio);
    std::printf("runners-up (whole-cluster simulations):\n");
    int shown = 0;
    for (const placement::Plan& p : r.disaggregated) {
      if (p.goodput.simulations == 0 || shown++ >= f.GetInt("top")) continue;
      std::printf("  %-56s %3d GPUs %10.4f req/s %10.4f per GPU\n", p.Describe().c_str(), p.gpus, p.goodput.rate,
                  p.goodput.per_gpu);
    }
    for (size_t i = 1; i < r.colocated.size() && i < 4; ++i) {
      const placement::Plan& p = r.colocated[i];
      if (p.goodput.simulations == 0) continue;  // an estimate, not simulated whole
      std::printf("  %-56s %3d GPUs %10.4f req/s %10.4f per GPU\n", p.Describe().c_str(), p.gpus, p.goodput.rate,
                  p.goodput.per_gpu);
    }
    std::printf("\n%d candidates, %d simulations, %.2f s\n", r.candidates, r.simulations, wall);
  }
  if (!f.GetString("emit").empty()) {
    std::ofstream out(f.GetString("emit"));
    out << placement::PlanToClusterJson(best, model, gpu, o);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", f.GetString("emit")));
    std::fprintf(stderr, "[duet place] wrote the plan to %s (duet sim --cluster reads it)\n", f.GetString("emit").c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunPlace(int argc, char** argv) {
  FlagSet f("duet place",
            "Searches prefill/decode placements (parallelism and instance counts) for the highest goodput per GPU "
            "that meets TTFT and TPOT targets, by simulation; prints the plan, the best colocated configuration "
            "for comparison, and the runners-up.");
  f.String("model", "opt-13b", "model: a preset, a HF id, or a model dir / config.json");
  f.String("latency", "", "latency model (as duet sim; default roofline:--gpu)");
  f.String("colocated-latency", "", "latency model of the colocated configurations (default: --latency)");
  f.String("gpu", "a100-80g", "GPU type (placement/hardware) or a JSON file");
  f.Int("nodes", 1, "nodes");
  f.Int("gpus-per-node", 4, "GPUs per node");
  f.String("gpu2", "", "heterogeneous pools: a second GPU type (prefill and decode may each use either pool)");
  f.Int("nodes2", 1, "nodes of the second GPU type");
  f.Int("gpus-per-node2", 4, "GPUs per node of the second type");
  f.String("latency2", "", "latency model of the second GPU type (default roofline:--gpu2)");
  f.String("affinity", "high", "high (instances may span nodes) | low (prefill and decode paired in a node)");
  f.Double("slo-ttft", 0.25, "TTFT target, seconds");
  f.Double("slo-tpot", 0.1, "TPOT target, seconds");
  f.Double("target", 0.9, "fraction of requests that must meet both targets");
  f.Int("max-pp", 4, "largest pipeline degree tried (a PP plan is chosen only if it beats every PP-free one by 5%)");
  f.Int("verify", 6, "whole-cluster simulations of the best decomposed estimates");
  f.Bool("exhaustive", "simulate every candidate as a whole cluster (small clusters)");
  f.Int("max-batch-tokens", kDefaultMaxBatchTokens, "prefill token budget per batch");
  AddLatencyFlags(f);
  AddWorkloadFlags(f, /*default_requests=*/2000);
  f.String("precision", "",
           "search weight precision with the parallelism: auto (bf16,q8,q4) or a list of dtypes; prefill and decode "
           "may differ (default: the model as given)");
  f.String("precision-sensitivity", "",
           "each dtype's quality cost: DTYPE=VALUE,... or a duet precision-plan map file (each uniform dtype: the "
           "sum of its layers' measured sensitivities)");
  f.Double("max-sensitivity", 1e300, "with --precision: the largest sensitivity a plan's roles may have");
  f.Int("top", 5, "runners-up to print");
  f.String("emit", "", "write the plan as a cluster file here");
  f.Bool("json", "print one JSON object");
  return RunWithFlags(f, argc, argv, Run);
}

}  // namespace duet::tools

// duet precision-plan: measures each layer's sensitivity to each candidate
// dtype on a calibration text and writes the precision map (one dtype per
// layer) that fits a size or decode-speed budget with the least total
// sensitivity (engine/precision_plan.h), then measures that map whole.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "text/bpe_trainer.h"
#include "engine/model.h"
#include "engine/precision_map.h"
#include "engine/precision_plan.h"
#include "engine/testing/model_maker.h"
#include "kernels/dtype.h"
#include "kernels/factory.h"
#include "tools/commands.h"

namespace duet::tools {
namespace {

absl::StatusOr<std::vector<kernels::DType>> ParseDTypes(const std::string& list) {
  std::vector<kernels::DType> out;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    ASSIGN_OR_RETURN(std::optional<kernels::DType> d, engine::ParseWeightDType(std::string_view(name.data(), name.size())));
    if (!d) return absl::InvalidArgumentError("--dtypes names dtypes, not auto");
    if (std::find(out.begin(), out.end(), *d) != out.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--dtypes names ", name, " twice"));
    }
    out.push_back(*d);
  }
  if (out.empty()) return absl::InvalidArgumentError("--dtypes is empty");
  return out;
}

// The linear weights of one layer, counted from the config.
// Layer i's linear weights: attention, then the MLP's, or a mixture of
// experts' router and experts (all of them: `read` of them, each token's
// experts_per_token, for what a batch-1 step reads).
double LayerWeights(const spec::ModelConfig& c, int64_t i, bool read = false) {
  const double H = static_cast<double>(c.hidden_size);
  const double attn = H * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * H;
  if (!c.IsMoeLayer(i)) return attn + 3.0 * c.intermediate_size * H;
  const double experts = static_cast<double>(read ? c.experts_per_token : c.num_experts);
  return attn + c.num_experts * H + experts * 3.0 * c.moe_intermediate_size * H;
}

absl::Status Run(const FlagSet& f) {
  std::string dir = f.GetString("model");
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, testing::EnsureCachedModel("tiny"));
  }
  const int budgets = f.IsSet("bits-per-weight") + f.IsSet("max-weight-gib") + f.IsSet("decode-tok-s");
  if (budgets != 1) {
    return absl::InvalidArgumentError("give exactly one budget: --bits-per-weight, --max-weight-gib or --decode-tok-s");
  }
  if (f.IsSet("decode-tok-s") != f.IsSet("bandwidth-gbs")) {
    return absl::InvalidArgumentError("--decode-tok-s and --bandwidth-gbs go together");
  }
  for (const char* flag : {"bits-per-weight", "max-weight-gib", "decode-tok-s", "bandwidth-gbs"}) {
    if (f.IsSet(flag) && !(f.GetDouble(flag) > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be positive"));
    }
  }
  if (f.GetInt("calibration-tokens") < 2) return absl::InvalidArgumentError("--calibration-tokens must be at least 2");
  ASSIGN_OR_RETURN(const std::vector<kernels::DType> dtypes, ParseDTypes(f.GetString("dtypes")));
  ASSIGN_OR_RETURN(const std::optional<kernels::DType> base, engine::ParseWeightDType(f.GetString("weight-dtype")));

  std::string text(text::TrainingCorpus());
  if (!f.GetString("calibration").empty()) {
    std::ifstream in(f.GetString("calibration"));
    if (!in) return absl::NotFoundError(absl::StrCat("--calibration ", f.GetString("calibration"), ": cannot open"));
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                   engine::CalibrationTokens(dir, text, f.GetInt("calibration-tokens")));
  ASSIGN_OR_RETURN(kernels::KernelBackendPtr backend,
                   kernels::NewBackend({.threads = static_cast<int>(f.GetInt("threads"))}));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model,
                   engine::Model::Load(dir, backend.get(), {.weight_dtype = base}));
  const spec::ModelConfig& c = model->config();
  if (c.gptq) return absl::InvalidArgumentError(absl::StrCat(dir, " is a GPTQ checkpoint: its layers are q4z already"));
  std::fprintf(stderr, "[duet precision-plan] %s: %lld layers, %zu calibration tokens, candidates %s\n", dir.c_str(),
               static_cast<long long>(c.num_layers), tokens.size(),
               absl::StrJoin(dtypes, ",", [](std::string* o, kernels::DType d) { o->append(kernels::DTypeName(d)); })
                   .c_str());
  ASSIGN_OR_RETURN(engine::Sensitivity s,
                   engine::MeasureSensitivity(*model, base, tokens, dtypes, [](const std::string& line) {
                     std::fprintf(stderr, "[duet precision-plan] %s\n", line.c_str());
                   }));

  // The budget, in bytes of the layers' linear weights.
  double weights = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) weights += LayerWeights(c, i);
  int64_t budget = 0;
  std::string budget_text;
  if (f.IsSet("bits-per-weight")) {
    budget = static_cast<int64_t>(f.GetDouble("bits-per-weight") / 8 * weights);
    budget_text = absl::StrCat(f.GetDouble("bits-per-weight"), " bits per layer weight");
  } else if (f.IsSet("max-weight-gib")) {
    budget = static_cast<int64_t>(f.GetDouble("max-weight-gib") * (1 << 30)) - s.other_bytes;
    budget_text = absl::StrCat(f.GetDouble("max-weight-gib"), " GiB of weights in all");
  } else {
    // Decode at batch 1 reads every weight once a step (the roofline; the
    // embedding table, of which a step reads one row, counted whole), a
    // mixture of experts only its token's experts of each sparse layer: the
    // budget is then on those bytes, each layer's its share of its own.
    budget = static_cast<int64_t>(f.GetDouble("bandwidth-gbs") * 1e9 / f.GetDouble("decode-tok-s")) - s.other_bytes;
    weights = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const double read = LayerWeights(c, i, true) / LayerWeights(c, i);
      for (int64_t& b : s.bytes[static_cast<size_t>(i)]) b = static_cast<int64_t>(std::llround(b * read));
      weights += LayerWeights(c, i, true);
    }
    budget_text = absl::StrCat(f.GetDouble("decode-tok-s"), " decode tokens/s at ", f.GetDouble("bandwidth-gbs"),
                               " GB/s (the roofline of a batch-1 step",
                               c.num_experts > 0 ? ", which reads each token's experts, not all" : "", ")");
  }
  ASSIGN_OR_RETURN(const engine::PrecisionPlan plan, engine::PlanPrecision(s, budget));

  // The map, measured whole.
  engine::PrecisionMap map;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    map.layers.push_back(dtypes[plan.choice[i]]);
    RETURN_IF_ERROR(model->ReloadLayer(i, map.layers.back()));
  }
  ASSIGN_OR_RETURN(const std::vector<float> logits, engine::CalibrationLogits(*model, tokens));
  const engine::LogitDrift measured = engine::CompareLogits(s.base_logits, logits, c.vocab_size);

  std::printf("duet precision-plan: %s, budget %s = %lld bytes of layer weights; sensitivity = mean KL(as loaded || "
              "that layer alone in the dtype) over %zu calibration tokens, nats\n",
              dir.c_str(), budget_text.c_str(), static_cast<long long>(budget), tokens.size());
  std::printf("%-6s", "layer");
  for (kernels::DType d : dtypes) std::printf(" %12s", kernels::DTypeName(d));
  std::printf("  %s\n", "chosen");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::printf("%-6lld", static_cast<long long>(i));
    for (size_t d = 0; d < dtypes.size(); ++d) std::printf(" %12.3e", s.kl[i][d]);
    std::printf("  %s\n", kernels::DTypeName(map.layers[i]));
  }
  std::printf("layer weights %lld bytes (%.2f bits each; program unit %lld bytes%s); total sensitivity %.3e, "
              "measured on the whole map: mean KL %.3e, top-1 agreement %.3f\n",
              static_cast<long long>(plan.layer_bytes), plan.layer_bytes * 8 / weights,
              static_cast<long long>(plan.unit_bytes), plan.rounded ? ", sizes rounded up" : "", plan.sensitivity,
              measured.mean_kl, measured.top1_agreement);

  nlohmann::ordered_json record;
  record["model"] = dir;
  record["base"] = base ? kernels::DTypeName(*base) : "auto";
  record["metric"] = "mean KL(as loaded || map) over the calibration tokens, nats";
  record["calibration_tokens"] = tokens.size();
  record["budget"] = budget_text;
  record["budget_layer_bytes"] = budget;
  record["layer_bytes"] = plan.layer_bytes;
  record["total_sensitivity"] = plan.sensitivity;
  record["measured_kl"] = measured.mean_kl;
  record["measured_top1_agreement"] = measured.top1_agreement;
  for (size_t d = 0; d < dtypes.size(); ++d) {
    std::vector<double> column;
    for (int64_t i = 0; i < c.num_layers; ++i) column.push_back(s.kl[i][d]);
    record["sensitivity"][kernels::DTypeName(dtypes[d])] = column;
  }
  const std::string path = f.GetString("out").empty()
                               ? absl::StrCat(std::filesystem::path(dir).filename().string(), "-precision.json")
                               : f.GetString("out");
  std::ofstream out(path);
  out << engine::PrecisionMapJson(map, record.dump());
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  std::printf("wrote %s (duet prefill|decode --model %s --precision-map %s)\n", path.c_str(), dir.c_str(),
              path.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunPrecisionPlan(int argc, char** argv) {
  FlagSet f("duet precision-plan",
            "Measures how much each layer's linear weights alone, held in each candidate dtype, move the model's "
            "logits on a calibration text (mean KL against the model as loaded), then picks one dtype per layer "
            "that fits the budget with the least total sensitivity (exact, by dynamic programming) and writes it "
            "as a precision map for --precision-map. Give one budget.");
  f.String("model", "", "model directory (default: the embedded tiny model)");
  f.Int("threads", 2, "engine threads");
  f.String("weight-dtype", "auto",
           "the dtype the model is loaded in, which sensitivities are measured against and which the embedding "
           "and lm_head keep (auto: as the checkpoint stores it)");
  f.String("dtypes", "bf16,q8,q4", "the candidate dtypes of a layer's linear weights");
  f.String("calibration", "", "a text file to calibrate on (default: duet's own English corpus)");
  f.Int("calibration-tokens", 256, "the calibration text's first N tokens, run as one sequence");
  f.Double("bits-per-weight", 0,
           absl::StrFormat("budget: the mean bits of a layer weight in memory, scales included (bf16 %g, q8 %g, "
                           "q4 %g, q4z %g)",
                           kernels::BitsPerWeight(kernels::DType::kBF16), kernels::BitsPerWeight(kernels::DType::kQ8),
                           kernels::BitsPerWeight(kernels::DType::kQ4), kernels::BitsPerWeight(kernels::DType::kQ4Z)));
  f.Double("max-weight-gib", 0, "budget: every weight of the model, GiB");
  f.Double("decode-tok-s", 0,
           "budget: batch-1 decode tokens/s, at --bandwidth-gbs (a step reads every weight once, a mixture of "
           "experts its token's experts: the roofline, which real steps reach only in part)");
  f.Double("bandwidth-gbs", 0, "the memory bandwidth --decode-tok-s assumes, GB/s");
  f.String("out", "", "where to write the map (default <model>-precision.json)");
  return RunWithFlags(f, argc, argv, Run);
}

}  // namespace duet::tools

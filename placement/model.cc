#include "placement/model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"
#include "spec/model_config.h"

namespace duet::placement {
namespace {

struct Preset {
  const char* name;
  const char* hf_id;
  ModelSpec spec;
};

ModelSpec Make(const char* name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
               int64_t intermediate, int64_t vocab, int64_t context, bool gated) {
  ModelSpec m;
  m.name = name;
  m.num_layers = layers;
  m.hidden = hidden;
  m.num_heads = heads;
  m.num_kv_heads = kv_heads;
  m.head_dim = hidden / heads;
  m.intermediate = intermediate;
  m.vocab = vocab;
  m.max_context = context;
  m.gated_mlp = gated;
  return m;
}

// A mixture of experts: `m` with `experts` experts of `inter`, top `k`, in every layer.
ModelSpec Moe(ModelSpec m, int64_t experts, int64_t k, int64_t inter) {
  m.num_experts = experts;
  m.experts_per_token = k;
  m.expert_intermediate = inter;
  m.moe_layers = m.num_layers;
  return m;
}

ModelSpec WithHeadDim(ModelSpec m, int64_t head_dim) {
  m.head_dim = head_dim;
  return m;
}

// The configs' published numbers.
const std::vector<Preset>& Presets() {
  static const std::vector<Preset> p = {
      {"opt-13b", "facebook/opt-13b", Make("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, false)},
      {"opt-66b", "facebook/opt-66b", Make("opt-66b", 64, 9216, 72, 72, 36864, 50272, 2048, false)},
      {"opt-175b", "facebook/opt-175b", Make("opt-175b", 96, 12288, 96, 96, 49152, 50272, 2048, false)},
      {"llama-2-7b", "meta-llama/Llama-2-7b-hf", Make("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, true)},
      {"llama-2-13b", "meta-llama/Llama-2-13b-hf", Make("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, true)},
      {"llama-2-70b", "meta-llama/Llama-2-70b-hf", Make("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, true)},
      {"llama-3-8b", "meta-llama/Meta-Llama-3-8B", Make("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, true)},
      {"llama-3-70b", "meta-llama/Meta-Llama-3-70B", Make("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, true)},
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B", Make("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, true)},
      {"qwen2.5-72b", "Qwen/Qwen2.5-72B", Make("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 32768, true)},
      {"mistral-7b", "mistralai/Mistral-7B-v0.1", Make("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768, true)},
      {"qwen3-8b", "Qwen/Qwen3-8B", Make("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960, true)},
      {"gemma-3-27b", "google/gemma-3-27b-it",
       WithHeadDim(Make("gemma-3-27b", 62, 5376, 32, 16, 21504, 262208, 131072, true), 128)},
      {"qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
       Moe(WithHeadDim(Make("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 40960, true), 128), 128, 8, 768)},
      {"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1",
       Moe(Make("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, true), 8, 2, 14336)},
  };
  return p;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

int64_t ModelSpec::LinearParamCount() const {
  return static_cast<int64_t>(std::llround(LinearParamsRead(-1)));
}

double ModelSpec::ExpectedExperts(int64_t tokens) const {
  if (num_experts == 0) return 0;
  const double e = static_cast<double>(num_experts);
  return e * (1 - std::pow(1 - static_cast<double>(experts_per_token) / e, static_cast<double>(tokens)));
}

// tokens < 0: every expert (what the model holds).
double ModelSpec::LinearParamsRead(int64_t tokens) const {
  const double attn = static_cast<double>(hidden) * num_heads * head_dim + 2.0 * hidden * num_kv_heads * head_dim +
                      static_cast<double>(num_heads) * head_dim * hidden;
  const double mlp = (gated_mlp ? 3.0 : 2.0) * hidden * intermediate;
  const double expert = 3.0 * hidden * expert_intermediate, router = static_cast<double>(num_experts) * hidden;
  const double experts = tokens < 0 ? static_cast<double>(num_experts) : ExpectedExperts(tokens);
  return num_layers * attn + static_cast<double>(num_layers - moe_layers) * mlp +
         moe_layers * (router + experts * expert);
}

double ModelSpec::WeightBytesRead(int64_t tokens) const {
  return static_cast<double>(WeightBytes()) - (LinearParamCount() - LinearParamsRead(tokens)) * LinearWeightBits() / 8;
}

int64_t ModelSpec::ParamCount() const { return LinearParamCount() + num_layers * 2 * hidden + vocab * hidden; }

double ModelSpec::LinearWeightBits() const {
  const std::optional<kernels::DType> d = kernels::ParseDType(weight_dtype);
  return d ? kernels::BitsPerWeight(*d) : 8.0 * static_cast<double>(dtype_bytes);
}

bool ModelSpec::QuantizedWeights() const {
  const std::optional<kernels::DType> d = kernels::ParseDType(weight_dtype);
  return d && kernels::IsQuantized(*d);
}

int64_t ModelSpec::WeightBytes() const {
  const int64_t linear = LinearParamCount();
  return static_cast<int64_t>(std::ceil(static_cast<double>(linear) * LinearWeightBits() / 8)) +
         (ParamCount() - linear) * dtype_bytes;
}

absl::StatusOr<ModelSpec> AtWeightDType(ModelSpec m, const std::string& dtype) {
  if (!kernels::ParseDType(dtype)) {
    std::string names;
    for (kernels::DType d : kernels::kAllDTypes) absl::StrAppend(&names, names.empty() ? "" : ", ", kernels::DTypeName(d));
    return absl::InvalidArgumentError(absl::StrCat("weight dtype \"", dtype, "\" is not one of ", names));
  }
  m.weight_dtype = dtype;
  return m;
}

double ModelSpec::TokenFlops(int64_t context) const {
  const double attn_proj = 2.0 * (hidden * num_heads * head_dim + 2.0 * hidden * num_kv_heads * head_dim +
                                  num_heads * head_dim * hidden);
  const double mlp = 2.0 * (gated_mlp ? 3 : 2) * hidden * intermediate;
  // A token's experts and the router, in a mixture's sparse layers.
  const double moe = 2.0 * (experts_per_token * 3.0 * hidden * expert_intermediate + num_experts * hidden);
  // QK^T and PV over the tokens before (and including) this one.
  const double attn = 4.0 * num_heads * head_dim * static_cast<double>(context + 1);
  return num_layers * (attn_proj + attn) + (num_layers - moe_layers) * mlp + moe_layers * moe +
         2.0 * hidden * vocab;
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> n;
  for (const Preset& p : Presets()) n.push_back(p.name);
  return n;
}

absl::StatusOr<ModelSpec> ModelPreset(const std::string& name) {
  const std::string want = Lower(name);
  for (const Preset& p : Presets()) {
    if (want == p.name || want == Lower(p.hf_id)) return p.spec;
  }
  return absl::NotFoundError(absl::StrCat("unknown model preset '", name, "'; presets: ",
                                          absl::StrJoin(ModelPresetNames(), ", "),
                                          " (or give a model directory or config.json)"));
}

absl::StatusOr<ModelSpec> ModelFromConfig(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  // The one config.json reader, in its planning mode (any architecture's shape).
  ASSIGN_OR_RETURN(spec::ModelConfig c, spec::ModelConfig::ShapeFromFile(p.string()));
  ModelSpec m;
  m.name = p.parent_path().filename().string();
  m.num_layers = c.num_layers;
  m.hidden = c.hidden_size;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads;
  m.intermediate = c.intermediate_size;
  m.vocab = c.vocab_size;
  m.max_context = c.max_position_embeddings;
  m.gated_mlp = c.model_type != "opt" && c.model_type != "gpt2";
  m.head_dim = c.head_dim;
  m.num_experts = c.num_experts;
  m.experts_per_token = c.experts_per_token;
  m.expert_intermediate = c.moe_intermediate_size;
  m.moe_layers = c.NumMoeLayers();
  return m;
}

absl::StatusOr<ModelSpec> LoadModelSpec(const std::string& name_or_path) {
  if (std::filesystem::exists(name_or_path)) return ModelFromConfig(name_or_path);
  return ModelPreset(name_or_path);
}

}  // namespace duet::placement

#include "spec/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"

namespace duet::spec {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field \"", field, "\" ", what));
  }
  const std::string& source() const { return source_; }

  absl::StatusOr<int64_t> Int(const std::string& field, bool required, int64_t def,
                              int64_t min_value) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) {
      if (required) return Error(field, "is missing");
      return def;
    }
    if (!it->is_number_integer()) return Error(field, "must be an integer");
    int64_t v = it->get<int64_t>();
    if (v < min_value) return Error(field, absl::StrCat("must be >= ", min_value, ", got ", v));
    return v;
  }

  // The first of `fields` present (so a field may go by another name), as Int.
  absl::StatusOr<int64_t> IntAnyOf(std::initializer_list<const char*> fields, bool required, int64_t def,
                                   int64_t min_value) const {
    for (const char* f : fields) {
      auto it = j_.find(f);
      if (it != j_.end() && !it->is_null()) return Int(f, required, def, min_value);
    }
    return Int(*fields.begin(), required, def, min_value);
  }

  absl::StatusOr<double> Double(const std::string& field, double def, double min_value) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return def;
    if (!it->is_number()) return Error(field, "must be a number");
    double v = it->get<double>();
    if (!(v > min_value)) return Error(field, absl::StrCat("must be > ", min_value));
    return v;
  }

  absl::StatusOr<bool> Bool(const std::string& field, bool def) const {
    auto it = j_.find(field);
    if (it == j_.end() || it->is_null()) return def;
    if (!it->is_boolean()) return Error(field, "must be a boolean");
    return it->get<bool>();
  }

 private:
  const json& j_;
  const std::string& source_;
};

// Gemma-3's own fields: its layers' kinds and windows, its two RoPEs, its
// scales and activation; soft-capping (which Gemma-3 leaves null) refused.
absl::Status ReadGemma3(const json& j, const Reader& r, ModelConfig& c) {
  c.gemma_norms = true;
  // sqrt(hidden), rounded to the checkpoint's dtype as Hugging Face's
  // Gemma3TextScaledWordEmbedding does (bf16: sqrt(1152) = 33.94 is 34).
  const float scale = std::sqrt(static_cast<float>(c.hidden_size));
  const auto dtype = j.find("torch_dtype");
  const std::string d = dtype != j.end() && dtype->is_string() ? dtype->get<std::string>() : "";
  c.embed_scale = d == "bfloat16" ? kernels::Bf16ToFloat(kernels::FloatToBf16(scale))
                  : d == "float16" ? kernels::HalfToFloat(kernels::FloatToHalf(scale))
                                   : scale;
  if (auto act = j.find("hidden_activation"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || (*act != "gelu_pytorch_tanh" && *act != "gelu")) {
      return r.Error("hidden_activation", "must be gelu_pytorch_tanh");
    }
  }
  c.mlp_activation = ModelConfig::Activation::kGeluTanh;
  ASSIGN_OR_RETURN(double scalar, r.Double("query_pre_attn_scalar", static_cast<double>(c.head_dim), 0.0));
  c.attn_scale = 1.0 / std::sqrt(scalar);
  // Gemma-2's soft-capping, which Gemma-3's configs leave null.
  ASSIGN_OR_RETURN(c.final_softcap, r.Double("final_logit_softcapping", 0.0, 0.0));
  ASSIGN_OR_RETURN(c.attn_softcap, r.Double("attn_logit_softcapping", 0.0, 0.0));
  ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window", false, 4096, 1));
  std::vector<bool> local(static_cast<size_t>(c.num_layers));
  if (auto types = j.find("layer_types"); types != j.end() && !types->is_null()) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_layers) {
      return r.Error("layer_types", absl::StrCat("must list ", c.num_layers, " layer kinds"));
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const json& t = (*types)[static_cast<size_t>(i)];
      if (t != "sliding_attention" && t != "full_attention") {
        return r.Error("layer_types", "holds a kind other than sliding_attention and full_attention");
      }
      local[static_cast<size_t>(i)] = t == "sliding_attention";
    }
  } else {
    // Every pattern-th layer is global (HF: (i + 1) % pattern != 0 is sliding).
    ASSIGN_OR_RETURN(int64_t pattern, r.Int("sliding_window_pattern", false, 6, 1));
    for (int64_t i = 0; i < c.num_layers; ++i) local[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  }
  for (int64_t i = 0; i < c.num_layers; ++i) c.layer_window[static_cast<size_t>(i)] = local[static_cast<size_t>(i)] ? window : 0;
  kernels::RopeConfig l{.head_dim = static_cast<int>(c.head_dim)};
  ASSIGN_OR_RETURN(l.theta, r.Double("rope_local_base_freq", 10000.0, 0.0));
  c.local_rope = l;
  return absl::OkStatus();
}

// The experts of qwen3_moe and mixtral (ModelConfig's MoE fields), and
// which layers have them.
absl::Status ReadMoe(const json& j, const Reader& r, ModelConfig& c) {
  const bool mixtral = c.model_type == "mixtral";
  ASSIGN_OR_RETURN(c.num_experts, r.Int(mixtral ? "num_local_experts" : "num_experts", true, 0, 1));
  ASSIGN_OR_RETURN(c.experts_per_token, r.Int("num_experts_per_tok", true, 0, 1));
  if (c.experts_per_token > c.num_experts) {
    return r.Error("num_experts_per_tok", absl::StrCat("(", c.experts_per_token, ") exceeds the experts (",
                                                       c.num_experts, ")"));
  }
  c.layer_moe.assign(static_cast<size_t>(c.num_layers), true);
  if (mixtral) {  // Every layer's MLP is experts of intermediate_size, renormalised top-k.
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(c.moe_intermediate_size, r.Int("moe_intermediate_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.norm_topk_prob, r.Bool("norm_topk_prob", false));
  // Hugging Face's rule: layer i is sparse unless mlp_only_layers names it
  // or (i + 1) is not a multiple of decoder_sparse_step.
  ASSIGN_OR_RETURN(int64_t step, r.Int("decoder_sparse_step", false, 1, 1));
  for (int64_t i = 0; i < c.num_layers; ++i) c.layer_moe[static_cast<size_t>(i)] = (i + 1) % step == 0;
  if (auto only = j.find("mlp_only_layers"); only != j.end() && !only->is_null()) {
    if (!only->is_array()) return r.Error("mlp_only_layers", "must be a list of layer indices");
    for (const json& l : *only) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.num_layers) {
        return r.Error("mlp_only_layers", absl::StrCat("must hold layer indices in 0..", c.num_layers - 1));
      }
      c.layer_moe[static_cast<size_t>(l.get<int64_t>())] = false;
    }
  }
  return absl::OkStatus();
}

// The ids a request's end depends on: eos_token_id (an integer or a list,
// added to those c holds) and bos_token_id (where set), checked against
// c.vocab_size.
absl::Status ReadTokenIds(const json& j, const Reader& r, ModelConfig& c) {
  auto eos = j.find("eos_token_id");
  if (eos != j.end() && !eos->is_null()) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int32_t>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (!e.is_number_integer()) return r.Error("eos_token_id", "must hold integers");
        c.eos_token_ids.push_back(e.get<int32_t>());
      }
    } else {
      return r.Error("eos_token_id", "must be an integer or a list of integers");
    }
  }
  for (int32_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) return r.Error("eos_token_id", "is outside the vocabulary");
  }
  std::vector<int32_t> unique;  // In order of appearance, each once.
  for (int32_t id : c.eos_token_ids) {
    if (std::find(unique.begin(), unique.end(), id) == unique.end()) unique.push_back(id);
  }
  c.eos_token_ids = std::move(unique);
  ASSIGN_OR_RETURN(int64_t bos, r.Int("bos_token_id", false, c.bos_token_id, -1));
  c.bos_token_id = static_cast<int32_t>(bos);
  return absl::OkStatus();
}

// The config object, or a multimodal Gemma-3's text model as one: its
// text_config over Hugging Face's Gemma3TextConfig defaults (the published
// configs leave most fields to them), the top level's token ids and dtype
// where text_config has none; `prefix` gets where its tensors are.
absl::StatusOr<json> ParseObject(const std::string& json_text, const std::string& source,
                                 std::string* prefix = nullptr) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  const auto mt = j.find("model_type");
  if (mt == j.end() || *mt != "gemma3") return j;
  const auto tc = j.find("text_config");
  if (tc == j.end() || !tc->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field \"text_config\" is missing or not an object"));
  }
  json text = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
               {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
               {"head_dim", 256}, {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 131072},
               {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"attention_bias", false},
               {"query_pre_attn_scalar", 256}, {"sliding_window", 4096}, {"rope_local_base_freq", 10000.0},
               {"sliding_window_pattern", 6}, {"tie_word_embeddings", true}};
  for (const auto& [k, v] : tc->items()) text[k] = v;
  for (const char* k : {"eos_token_id", "bos_token_id", "torch_dtype"}) {
    if (!text.contains(k) && j.contains(k)) text[k] = j[k];
  }
  text["model_type"] = "gemma3_text";
  if (prefix != nullptr) *prefix = "language_model.";
  return text;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// generation_config.json beside `config_path`, where there is one: its EOS
// ids join config.json's (Qwen3 lists two) and its sampling fields become
// the defaults of requests that set none.
absl::Status ReadGenerationConfig(const std::string& config_path, ModelConfig& c) {
  const std::filesystem::path path = std::filesystem::path(config_path).parent_path() / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string text, ReadText(path.string()));
  ASSIGN_OR_RETURN(json j, ParseObject(text, path.string()));
  Reader r(j, path.string());
  RETURN_IF_ERROR(ReadTokenIds(j, r, c));
  ModelConfig::SamplingDefaults& d = c.sampling_defaults;
  auto number = [&](const char* field, double lo, double hi, std::optional<double>& out) -> absl::Status {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number() || it->get<double>() < lo || it->get<double>() > hi) {
      return r.Error(field, absl::StrCat("must be a number in [", lo, ", ", hi, "]"));
    }
    out = it->get<double>();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(number("temperature", 0, 2, d.temperature));
  RETURN_IF_ERROR(number("top_p", 0, 1, d.top_p));
  RETURN_IF_ERROR(number("min_p", 0, 1, d.min_p));
  if (auto k = j.find("top_k"); k != j.end() && !k->is_null()) {
    ASSIGN_OR_RETURN(int64_t top_k, r.Int("top_k", false, 0, 0));
    d.top_k = top_k;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& json_text,
                                                  const std::string& source) {
  std::string prefix;
  ASSIGN_OR_RETURN(json j, ParseObject(json_text, source, &prefix));
  Reader r(j, source);
  ModelConfig c;
  c.tensor_prefix = prefix;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return r.Error("model_type", "is missing or not a string");
  c.model_type = mt->get<std::string>();
  static constexpr std::string_view kTypes[] = {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3_moe",
                                                 "mixtral"};
  if (std::find(std::begin(kTypes), std::end(kTypes), c.model_type) == std::end(kTypes)) {
    return r.Error("model_type", absl::StrCat("is \"", c.model_type,
                                              "\"; supported: llama, mistral, qwen2, qwen3, gemma3_text, qwen3_moe, "
                                              "mixtral"));
  }
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_heads, r.Int("num_attention_heads", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_kv_heads, r.Int("num_key_value_heads", false, c.num_heads, 1));
  if (c.num_heads % c.num_kv_heads != 0) {
    return r.Error("num_key_value_heads", absl::StrCat("(", c.num_kv_heads,
                                                       ") must divide num_attention_heads (",
                                                       c.num_heads, ")"));
  }
  if (c.hidden_size % c.num_heads != 0 && j.find("head_dim") == j.end()) {
    return r.Error("hidden_size", "is not a multiple of num_attention_heads and head_dim is unset");
  }
  ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", false, c.hidden_size / c.num_heads, 2));
  if (c.head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", false, 2048, 1));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.Double("rms_norm_eps", 1e-6, 0.0));
  c.rope.head_dim = static_cast<int>(c.head_dim);
  ASSIGN_OR_RETURN(c.rope.theta, r.Double("rope_theta", 10000.0, 0.0));
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) return r.Error("rope_scaling", "must be an object or null");
    std::string type;
    if (auto t = rs->find("rope_type"); t != rs->end() && t->is_string()) type = t->get<std::string>();
    else if (auto t2 = rs->find("type"); t2 != rs->end() && t2->is_string()) type = t2->get<std::string>();
    if (type != "llama3" && type != "linear" && type != "yarn" && type != "default") {
      return r.Error("rope_scaling", absl::StrCat("has rope_type \"", type,
                                                  "\"; supported: llama3, linear, yarn, default"));
    }
    // A positive number of rope_scaling's, named as such when it is not.
    Reader sr(*rs, source);
    auto sub = [&](const std::string& f, double def) -> absl::StatusOr<double> {
      auto v = sr.Double(f, def, 0.0);
      if (!v.ok()) return r.Error("rope_scaling." + f, "must be a positive number");
      return v;
    };
    if (type == "yarn") {
      ASSIGN_OR_RETURN(c.rope.yarn_factor, sub("factor", 0.0));
      if (c.rope.yarn_factor <= 0) return r.Error("rope_scaling.factor", "is required for yarn");
      ASSIGN_OR_RETURN(c.rope.yarn_original_max_position,
                       sub("original_max_position_embeddings", static_cast<double>(c.max_position_embeddings)));
      ASSIGN_OR_RETURN(c.rope.yarn_beta_fast, sub("beta_fast", 32.0));
      ASSIGN_OR_RETURN(c.rope.yarn_beta_slow, sub("beta_slow", 1.0));
      ASSIGN_OR_RETURN(c.rope.yarn_truncate, sr.Bool("truncate", true));
      // Hugging Face's get_mscale: 0.1 m ln(factor) + 1 (1 for factor <= 1).
      const double f = c.rope.yarn_factor;
      const auto mscale = [f](double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; };
      ASSIGN_OR_RETURN(double given, sub("attention_factor", 0.0));
      ASSIGN_OR_RETURN(double m, sub("mscale", 0.0));
      ASSIGN_OR_RETURN(double m_all, sub("mscale_all_dim", 0.0));
      c.rope.yarn_attention_factor = given > 0 ? given : m > 0 && m_all > 0 ? mscale(m) / mscale(m_all) : mscale(1.0);
    }
    if (type == "linear") {
      ASSIGN_OR_RETURN(c.rope.linear_factor, sub("factor", 1.0));
    }
    if (type == "llama3") {
      ASSIGN_OR_RETURN(c.rope.llama3_factor, sub("factor", 8.0));
      ASSIGN_OR_RETURN(c.rope.llama3_low_freq_factor, sub("low_freq_factor", 1.0));
      ASSIGN_OR_RETURN(c.rope.llama3_high_freq_factor, sub("high_freq_factor", 4.0));
      ASSIGN_OR_RETURN(c.rope.llama3_original_max_position,
                       sub("original_max_position_embeddings", 8192.0));
      if (c.rope.llama3_high_freq_factor <= c.rope.llama3_low_freq_factor) {
        return r.Error("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
      }
    }
  }
  ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", c.model_type == "gemma3_text"));
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v bias, never o bias.
  } else {
    ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
    c.o_bias = c.attention_bias;
    ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
  }
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe" || c.model_type == "gemma3_text";
  c.layer_window.assign(c.num_layers, 0);
  if (c.model_type == "gemma3_text") RETURN_IF_ERROR(ReadGemma3(j, r, c));
  if (c.model_type == "qwen3_moe" || c.model_type == "mixtral") RETURN_IF_ERROR(ReadMoe(j, r, c));
  if (c.model_type == "mistral" || c.model_type == "mixtral") {
    ASSIGN_OR_RETURN(int64_t w, r.Int("sliding_window", false, 0, 0));
    std::fill(c.layer_window.begin(), c.layer_window.end(), w);
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    ASSIGN_OR_RETURN(bool use, r.Bool("use_sliding_window", false));
    if (use) {
      ASSIGN_OR_RETURN(int64_t w, r.Int("sliding_window", true, 0, 1));
      ASSIGN_OR_RETURN(int64_t first, r.Int("max_window_layers", false, 0, 0));
      for (int64_t i = first; i < c.num_layers; ++i) c.layer_window[i] = w;
    }
  }
  RETURN_IF_ERROR(ReadTokenIds(j, r, c));
  if (auto d = j.find("torch_dtype"); d != j.end() && d->is_string()) c.torch_dtype = d->get<std::string>();
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    if (!q->is_object()) return r.Error("quantization_config", "must be an object");
    Reader qr(*q, source);
    const auto method = q->find("quant_method");
    const std::string m = method != q->end() && method->is_string() ? method->get<std::string>() : "";
    if (m != "gptq") {
      return absl::UnimplementedError(absl::StrCat(source, ": quantization_config.quant_method \"", m,
                                                   "\" is not supported (duet loads GPTQ; AWQ, GGUF and FP8 "
                                                   "checkpoints are not supported)"));
    }
    ASSIGN_OR_RETURN(int64_t bits, qr.Int("bits", true, 0, 1));
    if (bits != 4) {
      return absl::UnimplementedError(absl::StrCat(source, ": GPTQ with bits=", bits, " is not supported (4 only)"));
    }
    ASSIGN_OR_RETURN(bool desc_act, qr.Bool("desc_act", false));
    if (desc_act) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": GPTQ with desc_act=true (act-order groups) is not supported; desc_act=false only"));
    }
    ASSIGN_OR_RETURN(int64_t group, qr.Int("group_size", true, 0, -1));
    if (group == 0 || (group != -1 && group % 32 != 0)) {
      return r.Error("quantization_config.group_size", absl::StrCat("is ", group, "; duet loads -1 or a multiple of 32"));
    }
    ModelConfig::Gptq g{.group_size = group};
    if (auto f = q->find("checkpoint_format"); f != q->end() && f->is_string()) {
      if (*f != "gptq" && *f != "gptq_v2") {
        return r.Error("quantization_config.checkpoint_format", absl::StrCat("is ", f->dump(), "; gptq or gptq_v2"));
      }
      g.v2_zeros = *f == "gptq_v2";
    }
    c.gptq = g;
  }
  return c;
}

float ModelConfig::AttentionScale() const {
  // The default in float arithmetic, as the engine has always computed it.
  return attn_scale > 0 ? static_cast<float>(attn_scale) : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

const kernels::RopeConfig& ModelConfig::LayerRope(int64_t i) const {
  return local_rope && layer_window[static_cast<size_t>(i)] > 0 ? *local_rope : rope;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  ASSIGN_OR_RETURN(ModelConfig c, FromJson(text, path));
  RETURN_IF_ERROR(ReadGenerationConfig(path, c));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::ServingFromJson(const std::string& json_text, const std::string& source) {
  ASSIGN_OR_RETURN(json j, ParseObject(json_text, source));
  Reader r(j, source);
  ModelConfig c;
  if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string()) c.model_type = mt->get<std::string>();
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", true, 0, 1));
  RETURN_IF_ERROR(ReadTokenIds(j, r, c));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::ServingFromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  ASSIGN_OR_RETURN(ModelConfig c, ServingFromJson(text, path));
  RETURN_IF_ERROR(ReadGenerationConfig(path, c));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::ShapeFromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  ASSIGN_OR_RETURN(json j, ParseObject(text, path));
  Reader r(j, path);
  ModelConfig c;
  if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string()) c.model_type = mt->get<std::string>();
  ASSIGN_OR_RETURN(c.num_layers, r.IntAnyOf({"num_hidden_layers", "n_layer"}, true, 0, 1));
  ASSIGN_OR_RETURN(c.hidden_size, r.IntAnyOf({"hidden_size", "n_embd"}, true, 0, 1));
  ASSIGN_OR_RETURN(c.num_heads, r.IntAnyOf({"num_attention_heads", "n_head"}, true, 0, 1));
  ASSIGN_OR_RETURN(c.num_kv_heads, r.Int("num_key_value_heads", false, c.num_heads, 1));
  ASSIGN_OR_RETURN(c.intermediate_size, r.IntAnyOf({"intermediate_size", "ffn_dim"}, false, 4 * c.hidden_size, 1));
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.max_position_embeddings, r.IntAnyOf({"max_position_embeddings", "n_positions"}, false, 2048, 1));
  ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", false, c.hidden_size / c.num_heads, 1));
  c.layer_moe.assign(static_cast<size_t>(c.num_layers), false);
  if (c.model_type == "qwen3_moe" || c.model_type == "mixtral") RETURN_IF_ERROR(ReadMoe(j, r, c));
  return c;
}

bool ModelConfig::IsEos(int32_t id) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end();
}

int64_t ModelConfig::NumMoeLayers() const {
  return num_experts == 0 ? 0 : std::count(layer_moe.begin(), layer_moe.end(), true);
}

std::string ModelConfig::RouterName(int64_t i) const {
  return absl::StrCat("model.layers.", i, model_type == "mixtral" ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
}

ModelConfig::ExpertNames ModelConfig::ExpertTensorNames(int64_t i, int64_t e) const {
  if (model_type == "mixtral") {
    const std::string p = absl::StrCat("model.layers.", i, ".block_sparse_moe.experts.", e, ".");
    return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  }
  const std::string p = absl::StrCat("model.layers.", i, ".mlp.experts.", e, ".");
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

int64_t ModelConfig::NumActiveParameters() const {
  const int64_t per_expert = 3 * hidden_size * moe_intermediate_size;
  return NumParameters() - NumMoeLayers() * (num_experts - experts_per_token) * per_expert;
}

int64_t ModelConfig::NumParameters() const {
  int64_t per_layer = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size +
                      3 * hidden_size * intermediate_size + 2 * hidden_size;
  if (attention_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += hidden_size;
  if (qk_norm) per_layer += 2 * head_dim;
  if (gemma_norms) per_layer += 2 * hidden_size;  // post-attention and post-feedforward norms
  int64_t total = num_layers * per_layer + vocab_size * hidden_size + hidden_size;
  // A sparse layer holds its experts and its router instead of the dense MLP.
  total += NumMoeLayers() * (num_experts * (3 * hidden_size * moe_intermediate_size + hidden_size) -
                             3 * hidden_size * intermediate_size);
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

}  // namespace duet::spec

#include "tests/reference_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>

#include "engine/safetensors.h"

namespace duet::testing {
namespace {

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// y = W x (+ b), W stored [out][in] as in Hugging Face.
std::vector<double> Linear(const std::vector<double>& W, const std::vector<double>* b,
                           const std::vector<double>& x) {
  const size_t in = x.size(), out = W.size() / in;
  std::vector<double> y(out, 0.0);
  for (size_t o = 0; o < out; ++o) {
    double s = b ? (*b)[o] : 0.0;
    for (size_t i = 0; i < in; ++i) s += W[o * in + i] * x[i];
    y[o] = s;
  }
  return y;
}

// Rotary inverse frequencies, in double, with Llama-3 scaling by its
// published formula, or linear scaling.
std::vector<double> InvFreq(const kernels::RopeConfig& r, int64_t head_dim) {
  std::vector<double> out;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = 1.0 / std::pow(r.theta, 2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (r.llama3_factor > 0) {
      double wavelen = 2 * M_PI / f;
      double low_wl = r.llama3_original_max_position / r.llama3_low_freq_factor;
      double high_wl = r.llama3_original_max_position / r.llama3_high_freq_factor;
      if (wavelen > low_wl) {
        f = f / r.llama3_factor;
      } else if (wavelen >= high_wl) {
        double smooth = (r.llama3_original_max_position / wavelen - r.llama3_low_freq_factor) /
                        (r.llama3_high_freq_factor - r.llama3_low_freq_factor);
        f = (1 - smooth) * f / r.llama3_factor + smooth * f;
      }
    }
    if (r.yarn_factor > 0) {  // The published formula (Hugging Face's _compute_yarn_parameters).
      const double dim = static_cast<double>(head_dim), orig = r.yarn_original_max_position;
      auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(r.theta)); };
      double lo = corr(r.yarn_beta_fast), hi = corr(r.yarn_beta_slow);
      if (r.yarn_truncate) lo = std::floor(lo), hi = std::ceil(hi);
      lo = std::max(lo, 0.0);
      hi = std::min(hi, dim - 1);
      if (lo == hi) hi += 0.001;
      const double keep = 1 - std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
      f = f / r.yarn_factor * (1 - keep) + f * keep;
    }
    out.push_back(f / r.linear_factor);
  }
  return out;
}

}  // namespace

ReferenceModel::ReferenceModel(const std::string& dir, std::optional<kernels::DType> weights) {
  auto cfg = spec::ModelConfig::FromFile(dir + "/config.json");
  if (!cfg.ok()) throw std::runtime_error(cfg.status().ToString());
  config_ = *cfg;
  auto st = engine::SafetensorsModel::Open(dir, config_.tensor_prefix);
  if (!st.ok()) throw std::runtime_error(st.status().ToString());
  std::set<std::string> routers;
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (config_.IsMoeLayer(l)) routers.insert(config_.RouterName(l));
  }
  for (const std::string& name : (*st)->Names()) {
    const engine::TensorView& t = *(*st)->Find(name);
    std::vector<float> f = engine::ToFloat32(t);
    if (weights && t.shape.size() == 2 && routers.count(name) == 0) {
      f = kernels::Dequantize(kernels::QuantizeWeights(f.data(), t.shape[0], t.shape[1], *weights).view());
    }
    w_[name] = std::vector<double>(f.begin(), f.end());
  }
  inv_freq_ = InvFreq(config_.rope, config_.head_dim);
  if (config_.local_rope) inv_freq_local_ = InvFreq(*config_.local_rope, config_.head_dim);
}

const std::vector<double>& ReferenceModel::W(const std::string& name) const {
  auto it = w_.find(name);
  if (it == w_.end()) throw std::runtime_error("reference: missing tensor " + name);
  return it->second;
}

std::vector<double> ReferenceModel::Norm(const std::vector<double>& x, const std::string& name) const {
  std::vector<double> w = W(name);
  if (config_.gemma_norms) {
    for (double& v : w) v += 1.0;  // Gemma: x * (1 + w)
  }
  return RmsNorm(x, w, config_.rms_norm_eps);
}

std::vector<std::vector<double>> ReferenceModel::Logits(const std::vector<int32_t>& tokens) const {
  const auto& c = config_;
  const size_t T = tokens.size(), H = c.hidden_size, hd = c.head_dim;
  const size_t nq = c.num_heads, nkv = c.num_kv_heads;
  std::vector<std::vector<double>> x(T);
  const auto& emb = W("model.embed_tokens.weight");
  for (size_t t = 0; t < T; ++t) {
    x[t].assign(emb.begin() + tokens[t] * H, emb.begin() + (tokens[t] + 1) * H);
    for (double& v : x[t]) v *= c.embed_scale;
  }

  // yarn multiplies cos and sin by its attention factor (1 otherwise).
  auto rope = [&](std::vector<double>& v, size_t heads, size_t pos, const std::vector<double>& inv_freq,
                  double m) {
    for (size_t h = 0; h < heads; ++h) {
      for (size_t i = 0; i < hd / 2; ++i) {
        double a = pos * inv_freq[i];
        double x1 = v[h * hd + i], x2 = v[h * hd + i + hd / 2];
        v[h * hd + i] = x1 * m * std::cos(a) - x2 * m * std::sin(a);
        v[h * hd + i + hd / 2] = x2 * m * std::cos(a) + x1 * m * std::sin(a);
      }
    }
  };

  auto head_norm = [&](std::vector<double>& v, size_t heads, const std::string& name) {
    for (size_t h = 0; h < heads; ++h) {
      const std::vector<double> one(v.begin() + h * hd, v.begin() + (h + 1) * hd);
      const std::vector<double> normed = Norm(one, name);
      std::copy(normed.begin(), normed.end(), v.begin() + h * hd);
    }
  };

  // A SiLU-gated MLP of the three linears named.
  auto mlp = [&](const std::vector<double>& in, const std::string& gate, const std::string& up,
                 const std::string& down) {
    auto g = Linear(W(gate), nullptr, in);
    auto u = Linear(W(up), nullptr, in);
    for (size_t i = 0; i < g.size(); ++i) {
      const double a = c.mlp_activation == spec::ModelConfig::Activation::kGeluTanh
                           ? 0.5 * g[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                           : g[i] / (1 + std::exp(-g[i]));
      g[i] = a * u[i];
    }
    return Linear(W(down), nullptr, g);
  };
  min_router_margin_ = std::numeric_limits<double>::infinity();
  // A mixture of experts' MLP of layer l: the router's softmax, its top k
  // (Hugging Face's order: by probability), renormalised where the config
  // says, each chosen expert's MLP weighted by its probability.
  auto experts = [&](const std::vector<double>& in, int64_t l) {
    const std::vector<double> s = Linear(W(c.RouterName(l)), nullptr, in);
    std::vector<size_t> order(s.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
    const size_t k = static_cast<size_t>(c.experts_per_token);
    if (k < s.size()) min_router_margin_ = std::min(min_router_margin_, s[order[k - 1]] - s[order[k]]);
    const double mx = s[order[0]];
    double z = 0, chosen = 0;
    for (double v : s) z += std::exp(v - mx);
    for (size_t j = 0; j < k; ++j) chosen += std::exp(s[order[j]] - mx) / z;
    std::vector<double> out(in.size(), 0.0);
    for (size_t j = 0; j < k; ++j) {
      double w = std::exp(s[order[j]] - mx) / z;
      if (c.norm_topk_prob) w /= chosen;
      const spec::ModelConfig::ExpertNames n = c.ExpertTensorNames(l, static_cast<int64_t>(order[j]));
      const std::vector<double> y = mlp(in, n.gate, n.up, n.down);
      for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
    }
    return out;
  };

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool qkv_bias = c.attention_bias;
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto h = Norm(x[t], p + "input_layernorm.weight");
      q[t] = Linear(W(p + "self_attn.q_proj.weight"), qkv_bias ? &W(p + "self_attn.q_proj.bias") : nullptr, h);
      k[t] = Linear(W(p + "self_attn.k_proj.weight"), qkv_bias ? &W(p + "self_attn.k_proj.bias") : nullptr, h);
      v[t] = Linear(W(p + "self_attn.v_proj.weight"), qkv_bias ? &W(p + "self_attn.v_proj.bias") : nullptr, h);
      if (c.qk_norm) {  // Each head's q and k normalised before RoPE (qwen3).
        head_norm(q[t], nq, p + "self_attn.q_norm.weight");
        head_norm(k[t], nkv, p + "self_attn.k_norm.weight");
      }
      const bool local = c.local_rope && c.layer_window[l] > 0;
      const std::vector<double>& freq = local ? inv_freq_local_ : inv_freq_;
      const kernels::RopeConfig& rc = local ? *c.local_rope : c.rope;
      const double m = rc.yarn_factor > 0 ? rc.yarn_attention_factor : 1.0;
      rope(q[t], nq, t, freq, m);
      rope(k[t], nkv, t, freq, m);
    }
    const int64_t window = c.layer_window[l];
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> attn(nq * hd, 0.0);
      for (size_t h = 0; h < nq; ++h) {
        const size_t kh = h / (nq / nkv);
        const size_t lo = (window > 0 && t + 1 > static_cast<size_t>(window)) ? t + 1 - window : 0;
        std::vector<double> s;
        double mx = -1e300;
        for (size_t j = lo; j <= t; ++j) {
          double d = 0;
          for (size_t e = 0; e < hd; ++e) d += q[t][h * hd + e] * k[j][kh * hd + e];
          s.push_back(d * c.AttentionScale());
          if (c.attn_softcap > 0) s.back() = c.attn_softcap * std::tanh(s.back() / c.attn_softcap);
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (size_t j = lo; j <= t; ++j) {
          for (size_t e = 0; e < hd; ++e) attn[h * hd + e] += s[j - lo] / z * v[j][kh * hd + e];
        }
      }
      auto o = Linear(W(p + "self_attn.o_proj.weight"), c.o_bias ? &W(p + "self_attn.o_proj.bias") : nullptr, attn);
      // Gemma: post_attention_layernorm on the attention's output, then
      // pre_feedforward_layernorm before the MLP, post_feedforward on its output.
      if (c.gemma_norms) o = Norm(o, p + "post_attention_layernorm.weight");
      for (size_t i = 0; i < H; ++i) x[t][i] += o[i];
      auto h2 = Norm(x[t], p + (c.gemma_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"));
      auto d = c.IsMoeLayer(l) ? experts(h2, l)
                               : mlp(h2, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight");
      if (c.gemma_norms) d = Norm(d, p + "post_feedforward_layernorm.weight");
      for (size_t i = 0; i < H; ++i) x[t][i] += d[i];
    }
  }
  const auto& head = c.tie_word_embeddings ? W("model.embed_tokens.weight") : W("lm_head.weight");
  std::vector<std::vector<double>> out(T);
  for (size_t t = 0; t < T; ++t) {
    out[t] = Linear(head, nullptr, Norm(x[t], "model.norm.weight"));
    if (c.final_softcap > 0) {
      for (double& l : out[t]) l = c.final_softcap * std::tanh(l / c.final_softcap);
    }
  }
  return out;
}

double NormalizedError(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return den == 0 ? num : num / den;
}

}  // namespace duet::testing

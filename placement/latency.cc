#include "placement/latency.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace duet::placement {
namespace {

class ConstantLatency : public LatencyModel {
 public:
  ConstantLatency(double p, double d) : p_(p), d_(d) {}
  double Prefill(const Parallel&, absl::Span<const int64_t>) override { return p_; }
  double Decode(const Parallel&, absl::Span<const int64_t>) override { return d_; }
  std::string Describe() const override { return absl::StrCat("constant (prefill ", p_, " s, decode ", d_, " s)"); }

 private:
  const double p_, d_;
};

class ExponentialLatency : public LatencyModel {
 public:
  ExponentialLatency(double p, double d, uint64_t seed) : p_(p), d_(d), rng_(seed) {}
  double Prefill(const Parallel&, absl::Span<const int64_t>) override { return Draw(p_); }
  double Decode(const Parallel&, absl::Span<const int64_t>) override { return Draw(d_); }
  std::string Describe() const override {
    return absl::StrCat("exponential (mean prefill ", p_, " s, mean decode ", d_, " s)");
  }

 private:
  double Draw(double mean) {
    if (mean <= 0) return 0;
    return std::exponential_distribution<double>(1.0 / mean)(rng_);
  }
  const double p_, d_;
  std::mt19937_64 rng_;
};

class RooflineLatency : public LatencyModel {
 public:
  RooflineLatency(ModelSpec m, GpuSpec g, RooflineCoefficients c) : m_(std::move(m)), g_(std::move(g)), c_(c) {}

  double Prefill(const Parallel& p, absl::Span<const int64_t> lens) override {
    double flops = 0, kv_bytes = 0;
    int64_t tokens = 0;
    for (int64_t l : lens) {
      // Sum over positions of TokenFlops(context): the attention term grows with the position.
      flops += static_cast<double>(l) * m_.TokenFlops(0) +
               4.0 * m_.num_layers * m_.num_heads * m_.head_dim * 0.5 * static_cast<double>(l) * static_cast<double>(l);
      kv_bytes += static_cast<double>(l) * m_.KvBytesPerToken();
      tokens += l;
    }
    return Batch(p, flops, m_.WeightBytesRead(tokens) + kv_bytes, tokens);
  }

  double Decode(const Parallel& p, absl::Span<const int64_t> ctx) override {
    double flops = 0, kv_bytes = 0;
    for (int64_t c : ctx) {
      flops += m_.TokenFlops(c);
      kv_bytes += static_cast<double>(c + 1) * m_.KvBytesPerToken();
    }
    // A mixture of experts reads the experts its batch's rows chose.
    return Batch(p, flops, m_.WeightBytesRead(static_cast<int64_t>(ctx.size())) + kv_bytes,
                 static_cast<int64_t>(ctx.size()));
  }

  std::string Describe() const override {
    return absl::StrCat("roofline on ", g_.name, m_.weight_dtype.empty() ? "" : absl::StrCat(", ", m_.weight_dtype, " weights"),
                        " (compute eff ", c_.compute_efficiency, ", memory eff ",
                        c_.memory_efficiency, ", overhead ", c_.overhead_s, " s)");
  }

 private:
  double Batch(const Parallel& p, double flops, double bytes, int64_t tokens) const {
    const double tp = p.tp;
    if (m_.QuantizedWeights()) flops += m_.LinearParamsRead(tokens) * c_.dequant_flops_per_weight;
    double t = KernelSeconds(g_, {flops / tp, bytes / tp}, {c_.compute_efficiency, c_.memory_efficiency});
    // Two all-reduces per layer of the tokens' activations (ring).
    const double act = static_cast<double>(tokens) * m_.hidden * m_.dtype_bytes;
    t += 2.0 * m_.num_layers * AllReduceSeconds(g_, p.tp, act, c_.allreduce_latency_s);
    t += c_.overhead_s;
    // Each stage hands its activations to the next.
    return PipelineSeconds(t, p.pp, act / g_.intra_node_bw + c_.pp_stage_overhead_s);
  }

  const ModelSpec m_;
  const GpuSpec g_;
  const RooflineCoefficients c_;
};

class DistServeLatency : public LatencyModel {
 public:
  DistServeLatency(DistServeFit fit, std::string name) : fit_(std::move(fit)), name_(std::move(name)) {}

  bool Supports(const Parallel& p) const override { return fit_.by_tp.count(p.tp) > 0; }

  double IdlePenalty(double idle_s) const override {
    const auto& pts = fit_.idle_penalty_ms;
    if (pts.empty() || idle_s <= 0) return 0;
    double prev_s = 0, prev_ms = 0;
    for (const auto& [s, ms] : pts) {
      if (idle_s <= s) return (prev_ms + (ms - prev_ms) * (idle_s - prev_s) / (s - prev_s)) / 1e3;
      prev_s = s;
      prev_ms = ms;
    }
    return prev_ms / 1e3;
  }

  double Prefill(const Parallel& p, absl::Span<const int64_t> lens) override {
    const auto& c = At(p).prefill;
    double s1 = 0, s2 = 0;
    for (int64_t l : lens) {
      s1 += static_cast<double>(l);
      s2 += static_cast<double>(l) * static_cast<double>(l);
    }
    const double ms = c[0] + c[1] * s1 + c[2] * s2;
    return PipelineSeconds(ms / 1e3, p.pp, fit_.pp_stage_overhead_s);
  }

  double Decode(const Parallel& p, absl::Span<const int64_t> ctx) override {
    const DistServeFit::Coefficients& co = At(p);
    const double bs = static_cast<double>(ctx.size());
    double sum = 0;
    for (int64_t x : ctx) sum += static_cast<double>(x);
    if (!co.decode_by_batch.empty()) {
      const auto& t = co.decode_by_batch;
      auto at = [&](size_t i) { return t[i][1] + t[i][2] * sum; };
      double ms = at(0);
      if (bs > t.back()[0] && t.size() > 1) {
        // Each row past the last batch adds what a row added between the
        // last two (their `a`), its context priced at the last batch's `b`:
        // the `b`s' difference is already per context token, and times a
        // large batch's context it is not a row's cost.
        const size_t n = t.size();
        const double slope = std::max(0.0, (t[n - 1][1] - t[n - 2][1]) / (t[n - 1][0] - t[n - 2][0]));
        ms = at(n - 1) + slope * (bs - t[n - 1][0]);
      } else if (bs > t[0][0] && t.size() > 1) {
        size_t i = 1;
        while (i + 1 < t.size() && t[i][0] < bs) ++i;
        const double f = std::min(1.0, (bs - t[i - 1][0]) / (t[i][0] - t[i - 1][0]));
        ms = at(i - 1) + (at(i) - at(i - 1)) * f;
      }
      return PipelineSeconds(ms / 1e3, p.pp, fit_.pp_stage_overhead_s);
    }
    const auto& c = static_cast<int64_t>(ctx.size()) < co.threshold ? co.decode_small : co.decode_large;
    return PipelineSeconds((c[0] + c[1] * sum + c[2] * bs) / 1e3, p.pp, fit_.pp_stage_overhead_s);
  }

  std::string Describe() const override {
    std::string tps;
    for (const auto& [tp, c] : fit_.by_tp) absl::StrAppend(&tps, tps.empty() ? "" : ",", tp);
    return absl::StrCat("DistServe fit ", name_, " (TP ", tps, ")");
  }

 private:
  const DistServeFit::Coefficients& At(const Parallel& p) const {
    auto it = fit_.by_tp.find(p.tp);
    if (it != fit_.by_tp.end()) return it->second;
    return fit_.by_tp.begin()->second;  // callers check Supports
  }
  const DistServeFit fit_;
  const std::string name_;
};

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  return j;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

absl::StatusOr<std::pair<double, double>> TwoNumbers(absl::string_view s, absl::string_view what) {
  std::vector<std::string> parts = absl::StrSplit(s, ',');
  double a = 0, b = 0;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &a) || !absl::SimpleAtod(parts[1], &b) || a < 0 || b < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " needs two non-negative numbers, 'PREFILL_S,DECODE_S'"));
  }
  return std::make_pair(a, b);
}

class ScaledLatency : public LatencyModel {
 public:
  ScaledLatency(LatencyModel* base, std::vector<std::pair<int64_t, double>> table)
      : base_(base), table_(std::move(table)) {}
  double Prefill(const Parallel& p, absl::Span<const int64_t> lens) override {
    return FactorAtRows(table_, 0) * base_->Prefill(p, lens);
  }
  double Decode(const Parallel& p, absl::Span<const int64_t> ctx) override {
    return FactorAtRows(table_, static_cast<int64_t>(ctx.size())) * base_->Decode(p, ctx);
  }
  bool Supports(const Parallel& p) const override { return base_->Supports(p); }
  double IdlePenalty(double idle_s) const override { return base_->IdlePenalty(idle_s); }
  std::string Describe() const override {
    std::string t;
    for (const auto& [rows, f] : table_) absl::StrAppend(&t, t.empty() ? "" : ", ", rows, " rows: x", f);
    return absl::StrCat(base_->Describe(), " scaled (", t, ")");
  }

 private:
  LatencyModel* const base_;
  const std::vector<std::pair<int64_t, double>> table_;
};

}  // namespace

double ForwardPassSeconds(LatencyModel& m, const Parallel& p, absl::Span<const int64_t> prompt_lens,
                          absl::Span<const int64_t> context_lens) {
  if (prompt_lens.empty()) return context_lens.empty() ? 0.0 : m.Decode(p, context_lens);
  if (context_lens.empty()) return m.Prefill(p, prompt_lens);
  std::vector<int64_t> tokens(prompt_lens.begin(), prompt_lens.end());
  tokens.insert(tokens.end(), context_lens.size(), 1);
  const std::vector<int64_t> no_context(context_lens.size(), 0);
  const double attention = m.Decode(p, context_lens) - m.Decode(p, no_context);
  return m.Prefill(p, tokens) + std::max(0.0, attention);
}

double PipelineSeconds(double one_stage_s, int pp, double handoff_s) {
  return one_stage_s + (pp > 1 ? (pp - 1) * handoff_s : 0.0);
}

namespace {
class OverheadLatency : public LatencyModel {
 public:
  OverheadLatency(std::unique_ptr<LatencyModel> base, double fixed_s, double per_context_token_s)
      : base_(std::move(base)), fixed_s_(fixed_s), per_token_s_(per_context_token_s) {}
  double Prefill(const Parallel& p, absl::Span<const int64_t> lens) override {
    return base_->Prefill(p, lens) + fixed_s_ + per_token_s_ * Sum(lens);
  }
  double Decode(const Parallel& p, absl::Span<const int64_t> ctx) override {
    return base_->Decode(p, ctx) + fixed_s_ + per_token_s_ * Sum(ctx);
  }
  bool Supports(const Parallel& p) const override { return base_->Supports(p); }
  double IdlePenalty(double idle_s) const override { return base_->IdlePenalty(idle_s); }
  std::string Describe() const override {
    return absl::StrCat(base_->Describe(), " + ", fixed_s_ * 1e3, " ms + ", per_token_s_ * 1e3,
                        " ms per context token each batch");
  }

 private:
  static double Sum(absl::Span<const int64_t> v) {
    double s = 0;
    for (int64_t x : v) s += static_cast<double>(x);
    return s;
  }
  const std::unique_ptr<LatencyModel> base_;
  const double fixed_s_, per_token_s_;
};
}  // namespace

std::unique_ptr<LatencyModel> NewOverheadLatency(std::unique_ptr<LatencyModel> base, double fixed_s,
                                                 double per_context_token_s) {
  return std::make_unique<OverheadLatency>(std::move(base), fixed_s, per_context_token_s);
}

double FactorAtRows(const std::vector<std::pair<int64_t, double>>& table, int64_t rows) {
  if (table.empty()) return 1.0;
  if (rows <= table.front().first) return table.front().second;
  for (size_t i = 1; i < table.size(); ++i) {
    if (rows <= table[i].first) {
      const auto& [r0, f0] = table[i - 1];
      const auto& [r1, f1] = table[i];
      return f0 + (f1 - f0) * static_cast<double>(rows - r0) / static_cast<double>(r1 - r0);
    }
  }
  return table.back().second;
}

std::unique_ptr<LatencyModel> NewScaledLatency(LatencyModel* base,
                                               std::vector<std::pair<int64_t, double>> factor_by_rows) {
  return std::make_unique<ScaledLatency>(base, std::move(factor_by_rows));
}

std::unique_ptr<LatencyModel> NewConstantLatency(double p, double d) { return std::make_unique<ConstantLatency>(p, d); }
std::unique_ptr<LatencyModel> NewExponentialLatency(double p, double d, uint64_t seed) {
  return std::make_unique<ExponentialLatency>(p, d, seed);
}
std::unique_ptr<LatencyModel> NewRooflineLatency(ModelSpec m, GpuSpec g, RooflineCoefficients c) {
  return std::make_unique<RooflineLatency>(std::move(m), std::move(g), c);
}
std::unique_ptr<LatencyModel> NewDistServeLatency(DistServeFit fit, std::string name) {
  return std::make_unique<DistServeLatency>(std::move(fit), std::move(name));
}

absl::StatusOr<DistServeFit> LoadDistServeFit(const std::string& path, const ModelSpec& model) {
  ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(path));
  const nlohmann::json* entry = nullptr;
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) {
    absl::StrAppend(&keys, keys.empty() ? "" : ", ", it.key());
    const std::string k = Lower(it.key());
    const std::string tail = k.substr(k.find('/') == std::string::npos ? 0 : k.find('/') + 1);
    if (tail == Lower(model.name) || k == Lower(model.name)) entry = &it.value();
  }
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, " has no entry for ", model.name, " (it has ", keys, ")"));
  }
  DistServeFit fit;
  for (auto it = entry->begin(); it != entry->end(); ++it) {
    int tp = 0;
    if (!absl::SimpleAtoi(it.key(), &tp) || tp < 1) continue;
    const nlohmann::json& e = it.value();
    DistServeFit::Coefficients c;
    for (auto [key, out] : {std::pair<const char*, double*>{"prefill", c.prefill},
                            {"decoding_smallbs", c.decode_small},
                            {"decoding_largebs", c.decode_large}}) {
      if (!e.contains(key) || !e[key].is_array() || e[key].size() != 3) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", model.name, " TP ", tp, " lacks \"", key, "\" [a, b, c]"));
      }
      for (int i = 0; i < 3; ++i) out[i] = e[key][i].get<double>();
    }
    c.threshold = e.value("decoding_large_small_bs_threshold", 95);
    if (e.contains("decoding_by_batch")) {
      const nlohmann::json& t = e["decoding_by_batch"];
      double last = 0;
      for (const nlohmann::json& row : t.is_array() && !t.empty() ? t : nlohmann::json::array({nullptr})) {
        if (!row.is_array() || row.size() != 3 || !row[0].is_number() || !row[1].is_number() ||
            !row[2].is_number() || row[0].get<double>() < 1 || row[0].get<double>() <= last) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": ", model.name, " TP ", tp,
                                                         " \"decoding_by_batch\" must be [[batch, a, b], ...] "
                                                         "with rising batches of at least 1"));
        }
        last = row[0].get<double>();
        c.decode_by_batch.push_back({row[0].get<double>(), row[1].get<double>(), row[2].get<double>()});
      }
    }
    fit.by_tp[tp] = c;
  }
  if (fit.by_tp.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", model.name, " has no TP entries"));
  if (entry->contains("idle_penalty_ms")) {
    const nlohmann::json& ip = (*entry)["idle_penalty_ms"];
    double last = 0;
    for (const nlohmann::json& pt : ip.is_array() ? ip : nlohmann::json::array()) {
      if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number() ||
          pt[0].get<double>() <= last || pt[1].get<double>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": ", model.name, " \"idle_penalty_ms\" must be [[idle seconds, extra ms], ...] with rising seconds"));
      }
      last = pt[0].get<double>();
      fit.idle_penalty_ms.push_back({pt[0].get<double>(), pt[1].get<double>()});
    }
    if (!ip.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", model.name, " \"idle_penalty_ms\" is not an array"));
    }
  }
  return fit;
}

absl::StatusOr<std::unique_ptr<LatencyModel>> LoadLatencyModel(const std::string& spec, const ModelSpec& model,
                                                               uint64_t seed) {
  absl::string_view s = spec;
  if (absl::ConsumePrefix(&s, "constant:")) {
    ASSIGN_OR_RETURN(auto pd, TwoNumbers(s, "constant:"));
    return NewConstantLatency(pd.first, pd.second);
  }
  if (absl::ConsumePrefix(&s, "exponential:")) {
    ASSIGN_OR_RETURN(auto pd, TwoNumbers(s, "exponential:"));
    return NewExponentialLatency(pd.first, pd.second, seed);
  }
  if (absl::ConsumePrefix(&s, "roofline:")) {
    ASSIGN_OR_RETURN(GpuSpec g, LoadGpu(std::string(s)));
    return NewRooflineLatency(model, g);
  }
  if (!std::filesystem::exists(spec)) {
    return absl::NotFoundError(absl::StrCat("latency model '", spec,
                                            "': not a file, nor constant:P,D, exponential:P,D or roofline:GPU"));
  }
  ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(spec));
  if (j.value("kind", "") == "roofline") {
    ASSIGN_OR_RETURN(GpuSpec g, LoadGpu(j.value("gpu", "")));
    RooflineCoefficients c;
    c.compute_efficiency = j.value("compute_efficiency", c.compute_efficiency);
    c.memory_efficiency = j.value("memory_efficiency", c.memory_efficiency);
    c.overhead_s = j.value("overhead_s", c.overhead_s);
    c.allreduce_latency_s = j.value("allreduce_latency_s", c.allreduce_latency_s);
    c.pp_stage_overhead_s = j.value("pp_stage_overhead_s", c.pp_stage_overhead_s);
    return NewRooflineLatency(model, g, c);
  }
  ASSIGN_OR_RETURN(DistServeFit fit, LoadDistServeFit(spec, model));
  return NewDistServeLatency(std::move(fit), std::filesystem::path(spec).filename().string());
}

double PrefillSavedSeconds(LatencyModel& model, const Parallel& par, int64_t prefix, int64_t tokens) {
  const int64_t whole[1] = {prefix + tokens}, before[1] = {prefix};
  return std::max(model.Prefill(par, whole) - model.Prefill(par, before), 1e-9);
}

}  // namespace duet::placement

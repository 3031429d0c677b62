#include "engine/precision_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/block_pool.h"
#include "text/tokenizer.h"

namespace duet::engine {

absl::StatusOr<std::vector<int32_t>> CalibrationTokens(const std::string& model_dir, std::string_view text,
                                                       int64_t max_tokens) {
  ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> tokenizer, text::Tokenizer::Load(model_dir));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
  if (ids.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the calibration text has ", ids.size(), " tokens; it needs at least 2"));
  }
  return ids;
}

absl::StatusOr<std::vector<float>> CalibrationLogits(Model& model, absl::Span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n > model.config().max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the calibration text has ", n, " tokens, more than the model's "
                                                   "context of ", model.config().max_position_embeddings));
  }
  constexpr int64_t kBlock = 16;
  BlockPool pool(model.KvLayoutFor(kBlock), (n + kBlock - 1) / kBlock);
  SequenceKv seq(&pool);
  RETURN_IF_ERROR(seq.Reserve(n));
  BatchSeq b{.tokens = tokens, .start_pos = 0, .block_table = seq.block_table()};
  b.logit_rows.resize(static_cast<size_t>(n));
  std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
  ASSIGN_OR_RETURN(Logits logits, model.Forward({b}, pool));
  return std::move(logits.data);
}

LogitDrift CompareLogits(absl::Span<const float> base, absl::Span<const float> other, int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(base.size()) / vocab;
  // log-sum-exp of a row, in double.
  auto log_norm = [vocab](const float* x) {
    const double m = *std::max_element(x, x + vocab);
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(x[i] - m);
    return m + std::log(s);
  };
  double total = 0;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = base.data() + r * vocab;
    const float* q = other.data() + r * vocab;
    const double lp = log_norm(p), lq = log_norm(q);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double a = p[i] - lp, c = q[i] - lq;
      kl += std::exp(a) * (a - c);
    }
    total += std::max(0.0, kl);
    agree += std::max_element(p, p + vocab) - p == std::max_element(q, q + vocab) - q;
  }
  if (rows == 0) return {};
  return {total / static_cast<double>(rows), static_cast<double>(agree) / static_cast<double>(rows)};
}

absl::StatusOr<Sensitivity> MeasureSensitivity(Model& model, std::optional<kernels::DType> base,
                                               absl::Span<const int32_t> tokens,
                                               absl::Span<const kernels::DType> dtypes,
                                               const std::function<void(const std::string&)>& progress) {
  if (dtypes.empty()) return absl::InvalidArgumentError("no candidate dtypes");
  const int64_t layers = model.config().num_layers, vocab = model.config().vocab_size;
  Sensitivity s;
  s.dtypes.assign(dtypes.begin(), dtypes.end());
  ASSIGN_OR_RETURN(s.base_logits, CalibrationLogits(model, tokens));
  s.other_bytes = model.weight_bytes();
  for (int64_t i = 0; i < layers; ++i) s.other_bytes -= model.layer_weight_bytes(i);
  const std::vector<kernels::DType> loaded = model.layer_dtypes();
  s.kl.assign(static_cast<size_t>(layers), std::vector<double>(dtypes.size()));
  s.bytes.assign(static_cast<size_t>(layers), std::vector<int64_t>(dtypes.size()));
  for (int64_t i = 0; i < layers; ++i) {
    std::string line = absl::StrCat("layer ", i, " (", i + 1, " of ", layers, "):");
    for (size_t d = 0; d < dtypes.size(); ++d) {
      if (dtypes[d] == loaded[i]) {  // The model as loaded: no change.
        s.kl[i][d] = 0;
        s.bytes[i][d] = model.layer_weight_bytes(i);
      } else {
        RETURN_IF_ERROR(model.ReloadLayer(i, dtypes[d]));
        ASSIGN_OR_RETURN(std::vector<float> logits, CalibrationLogits(model, tokens));
        s.kl[i][d] = CompareLogits(s.base_logits, logits, vocab).mean_kl;
        s.bytes[i][d] = model.layer_weight_bytes(i);
      }
      absl::StrAppend(&line, " ", kernels::DTypeName(dtypes[d]), " KL ", s.kl[i][d]);
    }
    RETURN_IF_ERROR(model.ReloadLayer(i, base));
    if (progress) progress(line);
  }
  return s;
}

absl::StatusOr<PrecisionPlan> PlanPrecision(const Sensitivity& s, int64_t max_layer_bytes) {
  const size_t layers = s.kl.size(), nd = s.dtypes.size();
  if (layers == 0 || nd == 0) return absl::InvalidArgumentError("nothing to plan");
  int64_t least = 0, most = 0, g = 0;
  for (size_t i = 0; i < layers; ++i) {
    least += *std::min_element(s.bytes[i].begin(), s.bytes[i].end());
    most += *std::max_element(s.bytes[i].begin(), s.bytes[i].end());
    for (int64_t b : s.bytes[i]) g = std::gcd(g, b);
  }
  if (least > max_layer_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("no choice of dtypes fits: the layers need at least ", least,
                                                      " bytes, the budget is ", max_layer_bytes));
  }
  PrecisionPlan plan;
  plan.unit_bytes = std::max<int64_t>(1, g);
  constexpr int64_t kMaxUnits = int64_t{1} << 20;
  const int64_t cap_bytes = std::min(max_layer_bytes, most);
  if (cap_bytes / plan.unit_bytes > kMaxUnits) {
    plan.unit_bytes = (cap_bytes + kMaxUnits - 1) / kMaxUnits;
    plan.rounded = true;
  }
  const int64_t unit = plan.unit_bytes;
  const int64_t cap = cap_bytes / unit;
  auto units = [&](size_t i, size_t d) { return (s.bytes[i][d] + unit - 1) / unit; };
  // best[u]: least sensitivity of the layers so far in exactly u units.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(static_cast<size_t>(cap + 1), kInf), next;
  best[0] = 0;
  std::vector<std::vector<int8_t>> pick(layers, std::vector<int8_t>(static_cast<size_t>(cap + 1), -1));
  for (size_t i = 0; i < layers; ++i) {
    next.assign(static_cast<size_t>(cap + 1), kInf);
    for (int64_t u = 0; u <= cap; ++u) {
      if (best[u] == kInf) continue;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t v = u + units(i, d);
        if (v > cap) continue;
        const double cost = best[u] + s.kl[i][d];
        if (cost < next[v]) {
          next[v] = cost;
          pick[i][v] = static_cast<int8_t>(d);
        }
      }
    }
    best.swap(next);
  }
  int64_t at = -1;
  for (int64_t u = 0; u <= cap; ++u) {
    if (best[u] < kInf && (at < 0 || best[u] < best[at])) at = u;
  }
  if (at < 0) {
    return absl::FailedPreconditionError(absl::StrCat("no choice of dtypes fits ", max_layer_bytes, " bytes in units of ",
                                                      unit, " (sizes rounded up)"));
  }
  plan.choice.assign(layers, 0);
  for (size_t i = layers; i-- > 0;) {
    const int d = pick[i][at];
    plan.choice[i] = d;
    plan.sensitivity += s.kl[i][d];
    plan.layer_bytes += s.bytes[i][d];
    at -= units(i, d);
  }
  return plan;
}

}  // namespace duet::engine

// LLM-PQ's per-layer precision, measured rather than assumed: how much the
// model's output changes when one layer's linear weights alone are held in
// a lower-precision dtype, and the choice of one dtype per layer that fits a
// byte budget with the least total change. `duet precision-plan` runs both
// and writes a precision map (precision_map.h) workers load.
//
//   ASSIGN_OR_RETURN(auto tokens, CalibrationTokens(dir, text, 256));
//   ASSIGN_OR_RETURN(Sensitivity s, MeasureSensitivity(*model, std::nullopt, tokens, dtypes, progress));
//   ASSIGN_OR_RETURN(PrecisionPlan p, PlanPrecision(s, max_layer_bytes));
//
// The error measure is the mean over the calibration text's positions of
// KL(p_base || p), p the softmax of the logits, p_base the model as loaded;
// a map's total sensitivity (the sum over its layers) predicts its error,
// which `duet precision-plan` then measures on the whole map.
#ifndef DUET_ENGINE_PRECISION_PLAN_H_
#define DUET_ENGINE_PRECISION_PLAN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model.h"
#include "kernels/dtype.h"

namespace duet::engine {

// The first `max_tokens` tokens of `text` under the tokenizer in
// `model_dir`; InvalidArgument when the text has fewer than 2.
absl::StatusOr<std::vector<int32_t>> CalibrationTokens(const std::string& model_dir, std::string_view text,
                                                       int64_t max_tokens);

// The logits at every position of `tokens`, one sequence run in one step:
// [position][vocab].
absl::StatusOr<std::vector<float>> CalibrationLogits(Model& model, absl::Span<const int32_t> tokens);

// How far `other`'s logit rows are from `base`'s: the mean over rows of
// KL(softmax(base row) || softmax(other row)) in nats, and the share of rows
// whose largest logit is at the same token.
struct LogitDrift {
  double mean_kl = 0;
  double top1_agreement = 1;
};
LogitDrift CompareLogits(absl::Span<const float> base, absl::Span<const float> other, int64_t vocab);

struct Sensitivity {
  std::vector<kernels::DType> dtypes;     // The candidates, in the order of the columns below.
  std::vector<std::vector<double>> kl;    // [layer][dtype]: that layer alone in that dtype.
  std::vector<std::vector<int64_t>> bytes;  // [layer][dtype]: that layer's linear weights' bytes.
  int64_t other_bytes = 0;  // Every weight outside the layers' linear weights, as loaded.
  std::vector<float> base_logits;  // The model as loaded, on the calibration tokens.
};

// Measures every (layer, candidate) pair on `model`, which must be loaded
// without a precision map; `base` is the dtype it was loaded with
// (LoadOptions::weight_dtype) and each layer returns to it afterwards.
// `progress` (may be empty) hears one line per layer.
absl::StatusOr<Sensitivity> MeasureSensitivity(Model& model, std::optional<kernels::DType> base,
                                               absl::Span<const int32_t> tokens,
                                               absl::Span<const kernels::DType> dtypes,
                                               const std::function<void(const std::string&)>& progress);

struct PrecisionPlan {
  std::vector<int> choice;  // [layer]: a column of Sensitivity.
  double sensitivity = 0;   // The sum of the chosen kl entries.
  int64_t layer_bytes = 0;  // The sum of the chosen bytes entries.
  int64_t unit_bytes = 0;   // The program's byte unit (1 when exact to the byte).
  bool rounded = false;     // Sizes were rounded up to unit_bytes (still within the budget).
};

// The choice of one column per layer with the least total sensitivity whose
// layer bytes are at most `max_layer_bytes`: a multiple-choice knapsack,
// solved exactly by dynamic programming over bytes in units of the gcd of
// all sizes (every layer of a Llama model has the same shapes, so this is
// a few hundred units); when that would exceed 2^20 units the sizes are
// rounded up to a coarser unit, so the plan still fits but may miss the
// optimum by that rounding. FailedPrecondition, naming the least bytes any
// choice needs, when nothing fits.
absl::StatusOr<PrecisionPlan> PlanPrecision(const Sensitivity& s, int64_t max_layer_bytes);

}  // namespace duet::engine

#endif  // DUET_ENGINE_PRECISION_PLAN_H_

// A naive double-precision Llama-family forward pass, written apart from the
// engine, for tests: contiguous KV, plain loops, weights read by their
// Hugging Face names straight from the safetensors files.
//
//   ReferenceModel ref(dir);
//   std::vector<std::vector<double>> logits = ref.Logits(tokens);  // every position
//   ReferenceModel q8(dir, kernels::DType::kQ8);  // on the weights the engine's q8 holds
#ifndef DUET_TESTS_REFERENCE_MODEL_H_
#define DUET_TESTS_REFERENCE_MODEL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "spec/model_config.h"
#include "kernels/dtype.h"

namespace duet::testing {

class ReferenceModel {
 public:
  // With `weights`, every weight matrix (each 2-D tensor) but a mixture of
  // experts' routers (which the engine keeps in f32) is replaced by what
  // that dtype holds of it (kernels::Dequantize of QuantizeWeights), as the
  // engine's --weight-dtype loads it.
  explicit ReferenceModel(const std::string& dir, std::optional<kernels::DType> weights = std::nullopt);
  const spec::ModelConfig& config() const { return config_; }
  // Logits for every position of `tokens`, causal over the whole list.
  std::vector<std::vector<double>> Logits(const std::vector<int32_t>& tokens) const;
  // Of the last Logits call on a mixture of experts: the smallest gap, over
  // every token and MoE layer, between the router's score of the last
  // expert chosen and of the first not chosen (a near tie there could let
  // float rounding choose another expert). Infinity on a dense model.
  double min_router_margin() const { return min_router_margin_; }

 private:
  const std::vector<double>& W(const std::string& name) const;
  // RMSNorm of x by the norm weights `name` (Gemma's x * (1 + w) where the config says).
  std::vector<double> Norm(const std::vector<double>& x, const std::string& name) const;
  spec::ModelConfig config_;
  std::map<std::string, std::vector<double>> w_;
  std::vector<double> inv_freq_, inv_freq_local_;
  mutable double min_router_margin_ = 0;
};

// max|a - b| / max|b| over all positions.
double NormalizedError(const std::vector<float>& got, const std::vector<double>& want);

}  // namespace duet::testing

#endif  // DUET_TESTS_REFERENCE_MODEL_H_

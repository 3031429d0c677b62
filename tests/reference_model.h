// A naive double-precision Llama-family forward pass, written apart from the
// engine, for tests: contiguous KV, plain loops, weights read by their
// Hugging Face names straight from the safetensors files.
//
//   ReferenceModel ref(dir);
//   std::vector<std::vector<double>> logits = ref.Logits(tokens);  // every position
#ifndef DUET_TESTS_REFERENCE_MODEL_H_
#define DUET_TESTS_REFERENCE_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/model_config.h"

namespace duet::testing {

class ReferenceModel {
 public:
  explicit ReferenceModel(const std::string& dir);
  const engine::ModelConfig& config() const { return config_; }
  // Logits for every position of `tokens`, causal over the whole list.
  std::vector<std::vector<double>> Logits(const std::vector<int32_t>& tokens) const;

 private:
  const std::vector<double>& W(const std::string& name) const;
  engine::ModelConfig config_;
  std::map<std::string, std::vector<double>> w_;
  std::vector<double> inv_freq_;
};

// max|a - b| / max|b| over all positions.
double NormalizedError(const std::vector<float>& got, const std::vector<double>& want);

}  // namespace duet::testing

#endif  // DUET_TESTS_REFERENCE_MODEL_H_

// Model shapes for the latency model and the simulator: enough of a
// transformer's geometry to count FLOPs, weight bytes and KV bytes, with no
// weights. From a Hugging Face config.json or a built-in preset.
//
//   ASSIGN_OR_RETURN(ModelSpec m, ModelPreset("llama-2-7b"));
//   ASSIGN_OR_RETURN(ModelSpec m, ModelFromConfig("path/to/model"));  // dir or config.json
#ifndef DUET_PLACEMENT_MODEL_H_
#define DUET_PLACEMENT_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

struct ModelSpec {
  std::string name;
  int64_t num_layers = 0;
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  int64_t max_context = 0;
  bool gated_mlp = true;  // SwiGLU: three MLP matrices; OPT: two.
  int64_t dtype_bytes = 2;  // Activations, KV, norms, embeddings; linear weights unless weight_dtype says.
  // The layers' linear weights' dtype (kernels/dtype.h: bf16, f16, q8, q4,
  // q4z; their bits in memory, scales included); empty: dtype_bytes.
  std::string weight_dtype;
  // A mixture of experts: moe_layers of the layers hold num_experts experts
  // of expert_intermediate (and a router) in place of the dense MLP, and
  // each token runs experts_per_token of them. 0: a dense model.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate = 0;
  int64_t moe_layers = 0;

  // Parameters of the transformer blocks and the embeddings (and the LM head
  // when untied; counted once either way).
  int64_t ParamCount() const;
  // The layers' linear weights (attention projections and MLP; every
  // expert and router).
  int64_t LinearParamCount() const;
  // The distinct experts a batch of `tokens` tokens touches in one layer,
  // expected under uniform routing: E (1 - (1 - k/E)^tokens) (0 for a dense
  // model).
  double ExpectedExperts(int64_t tokens) const;
  // The linear weights a forward pass of `tokens` tokens reads: all of a
  // dense model's, a mixture's dense parts and the experts its tokens touch
  // (ExpectedExperts).
  double LinearParamsRead(int64_t tokens) const;
  // Weight bytes that pass reads: WeightBytes with only those experts.
  double WeightBytesRead(int64_t tokens) const;
  double LinearWeightBits() const;
  bool QuantizedWeights() const;  // weight_dtype is q8, q4 or q4z
  int64_t WeightBytes() const;
  // K and V of one token in every layer.
  int64_t KvBytesPerToken() const { return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes; }
  // Forward FLOPs of one token with `context` tokens before it (GEMMs and
  // attention score/value products), summed over layers, plus the LM head.
  double TokenFlops(int64_t context) const;
};

// Built-in shapes, by lower-case name: opt-13b, opt-66b, opt-175b,
// llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b,
// qwen2.5-7b, qwen2.5-72b, mistral-7b, qwen3-8b, gemma-3-27b (the text
// model, every layer's KV counted whole), and the mixtures of experts
// qwen3-30b-a3b and mixtral-8x7b. Hugging Face ids ("facebook/opt-13b",
// "meta-llama/Llama-2-7b-hf") are accepted too.
absl::StatusOr<ModelSpec> ModelPreset(const std::string& name);
std::vector<std::string> ModelPresetNames();

// `m` with its linear weights in `dtype` (a kernels/dtype.h name);
// InvalidArgument naming the choices otherwise.
absl::StatusOr<ModelSpec> AtWeightDType(ModelSpec m, const std::string& dtype);

// From a model directory or its config.json (any Llama-family or OPT shape;
// qwen3_moe's and mixtral's experts).
absl::StatusOr<ModelSpec> ModelFromConfig(const std::string& path);

// A preset name, a Hugging Face id, or a path to a config.
absl::StatusOr<ModelSpec> LoadModelSpec(const std::string& name_or_path);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_MODEL_H_

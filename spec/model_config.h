// The shape of a Llama-family model, read from a Hugging Face config.json.
//
//   ASSIGN_OR_RETURN(ModelConfig cfg, ModelConfig::FromFile(dir + "/config.json"));
//   int64_t q_dim = cfg.num_heads * cfg.head_dim;
//
// Supported `model_type`s: llama (with Llama-3 rope_scaling), mistral (with
// sliding_window), qwen2 (q/k/v bias, per-layer sliding window when
// use_sliding_window is set) and qwen3 (qwen2's layout with a per-head
// RMSNorm of q and k before RoPE, attention_bias as the config says,
// head_dim its own) and gemma3_text (Gemma-3's text model: RMSNorm as
// x * (1 + w) with norms before and after attention and the MLP, q/k norms,
// the embedding scaled by sqrt(hidden_size) (in the checkpoint's dtype), a GELU-tanh MLP, local
// sliding-window layers with their own RoPE base between global ones,
// query_pre_attn_scalar, the soft-capping fields where set), and the mixtures of
// experts qwen3_moe (qwen3's attention; each sparse layer's MLP num_experts
// experts of moe_intermediate_size, num_experts_per_tok chosen per token,
// norm_topk_prob, decoder_sparse_step and mlp_only_layers naming the dense
// layers) and mixtral (mistral's attention; num_local_experts experts of
// intermediate_size in every layer, the chosen experts' weights a softmax
// over them). A multimodal Gemma-3 config (model_type gemma3) is read as
// its text_config with Gemma3TextConfig's defaults, its tensors under
// language_model. (tensor_prefix). Anything else, or a missing or ill-typed
// field, is InvalidArgument naming the file and the field.
#ifndef DUET_SPEC_MODEL_CONFIG_H_
#define DUET_SPEC_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/rope.h"

namespace duet::spec {

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | gemma3_text | qwen3_moe | mixtral
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  kernels::RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for llama) projections carry a bias.
  bool o_bias = false;
  bool mlp_bias = false;
  // Each head's q and k RMS-normalised (q_norm, k_norm weights of head_dim)
  // before RoPE: qwen3.
  bool qk_norm = false;
  // Gemma-3: norms as x * (1 + w) (the loader folds the 1 in), a norm on
  // the attention's and the MLP's outputs before each residual add (and
  // the pre-MLP norm is pre_feedforward_layernorm), the embedding times
  // embed_scale.
  bool gemma_norms = false;
  enum class Activation { kSilu, kGeluTanh };
  Activation mlp_activation = Activation::kSilu;
  double embed_scale = 1.0;
  // The attention's score scale: 1 / sqrt(head_dim) unless a config says
  // otherwise (Gemma-3: query_pre_attn_scalar ** -0.5).
  double attn_scale = 0;
  // Soft-capping (final_logit_softcapping, attn_logit_softcapping; 0: none):
  // logits, and the attention's scaled scores, x -> cap * tanh(x / cap).
  double final_softcap = 0;
  double attn_softcap = 0;
  // RoPE of the sliding-window layers where it differs from `rope`
  // (Gemma-3's rope_local_base_freq, no scaling); nullopt: `rope` everywhere.
  std::optional<kernels::RopeConfig> local_rope;
  // Mixture of experts: a router (a [num_experts][hidden] linear) scores
  // each token, the softmax of the scores picks experts_per_token experts,
  // and the token's MLP output is their SiLU-gated MLPs' (each of
  // moe_intermediate_size) weighted by those probabilities, renormalised to
  // sum to one where norm_topk_prob is set. Layers whose layer_moe is false
  // keep a dense MLP of intermediate_size. num_experts 0: a dense model.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> layer_moe;
  // Sliding window per layer (0 = full attention).
  std::vector<int64_t> layer_window;
  std::vector<int32_t> eos_token_ids;  // config.json's, then generation_config.json's others
  int32_t bos_token_id = -1;
  std::string torch_dtype;
  // Where a multimodal checkpoint keeps its text model's tensors
  // (Gemma3ForConditionalGeneration, model_type gemma3: "language_model.");
  // the text model is what duet serves, its config the text_config.
  std::string tensor_prefix;
  // generation_config.json's sampling fields: what a request that sets none
  // of a field gets (as vLLM serves a checkpoint's defaults).
  struct SamplingDefaults {
    std::optional<double> temperature, top_p, min_p;
    std::optional<int64_t> top_k;
  };
  SamplingDefaults sampling_defaults;
  // quantization_config of a GPTQ checkpoint (4 bits, desc_act false): its
  // linear layers are stored as qweight/qzeros/scales/g_idx and load as
  // kernels' kQ4Z. group_size -1 (one group per row) is kept as k.
  struct Gptq {
    int64_t group_size = 0;
    bool v2_zeros = false;  // checkpoint_format "gptq_v2": zeros stored as is, not minus one.
  };
  std::optional<Gptq> gptq;

  static absl::StatusOr<ModelConfig> FromJson(const std::string& json_text,
                                              const std::string& source_name);
  // The file's, and a generation_config.json beside it where there is one
  // (its EOS ids join the list; its sampling fields are the defaults).
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  // Only what serving a request's tokens needs, by the same field rules:
  // vocab_size and max_position_embeddings (both required here), the EOS
  // and BOS ids (ServingFromFile: and generation_config.json's, as
  // FromFile); the rest stays zero. The router reads this, so it serves
  // any model whose tokenizer it has, architectures the engine lacks too.
  static absl::StatusOr<ModelConfig> ServingFromJson(const std::string& json_text, const std::string& source_name);
  static absl::StatusOr<ModelConfig> ServingFromFile(const std::string& path);
  // The shape alone, for planning a model duet may not serve (placement/:
  // OPT, GPT-2 and the like), by the same field rules and under either
  // name: num_hidden_layers | n_layer, hidden_size | n_embd,
  // num_attention_heads | n_head and vocab_size are required;
  // num_key_value_heads (the heads), intermediate_size | ffn_dim (4 x
  // hidden), max_position_embeddings | n_positions (2048) and head_dim
  // (hidden / heads) are not, nor are qwen3_moe's and mixtral's expert
  // fields (read as FromJson reads them); model_type is taken as given.
  static absl::StatusOr<ModelConfig> ShapeFromFile(const std::string& path);

  int64_t q_dim() const { return num_heads * head_dim; }
  bool IsMoeLayer(int64_t i) const { return num_experts > 0 && layer_moe[static_cast<size_t>(i)]; }
  int64_t NumMoeLayers() const;
  // The checkpoint's names of layer i's router and of expert e's three
  // linears (qwen3_moe: mlp.gate, mlp.experts.E.{gate,up,down}_proj;
  // mixtral: block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2}).
  struct ExpertNames {
    std::string gate, up, down;
  };
  std::string RouterName(int64_t i) const;
  ExpertNames ExpertTensorNames(int64_t i, int64_t e) const;
  float AttentionScale() const;
  // The RoPE of layer i: local_rope on a sliding-window layer if set, else rope.
  const kernels::RopeConfig& LayerRope(int64_t i) const;
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool IsEos(int32_t id) const;
  // Parameters in the weights, embeddings included (every expert's).
  int64_t NumParameters() const;
  // Those a token's forward pass reads: NumParameters with only
  // experts_per_token of each MoE layer's experts (NumParameters for a dense
  // model).
  int64_t NumActiveParameters() const;
};

}  // namespace duet::spec

#endif  // DUET_SPEC_MODEL_CONFIG_H_

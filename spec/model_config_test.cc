#include "spec/model_config.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace duet::spec {
namespace {

using Catch::Matchers::Contains;

constexpr char kLlama[] = R"({
  "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";

TEST_CASE("Llama-3.1-8B's config.json", "[config]") {
  auto c = ModelConfig::FromJson(kLlama, "config.json");
  REQUIRE(c.ok());
  REQUIRE(c->head_dim == 128);
  REQUIRE(c->kv_dim() == 1024);
  REQUIRE(c->rope.llama3_factor == 8.0);
  REQUIRE(c->rope.llama3_original_max_position == 8192.0);
  REQUIRE(c->IsEos(128009));
  REQUIRE_FALSE(c->IsEos(128000));
  REQUIRE(c->layer_window == std::vector<int64_t>(32, 0));
  // 8.03B parameters, as published.
  REQUIRE(c->NumParameters() == 8030261248);
}

TEST_CASE("mistral's sliding window and qwen2's bias and per-layer window", "[config]") {
  auto m = ModelConfig::FromJson(R"({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 8, "sliding_window": 4096, "eos_token_id": 2})", "m.json");
  REQUIRE(m.ok());
  REQUIRE(m->layer_window == std::vector<int64_t>(4, 4096));
  REQUIRE_FALSE(m->attention_bias);
  auto q = ModelConfig::FromJson(R"({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 4, "num_attention_heads": 28,
    "num_key_value_heads": 4, "use_sliding_window": true, "sliding_window": 100,
    "max_window_layers": 2, "tie_word_embeddings": true})", "q.json");
  REQUIRE(q.ok());
  REQUIRE(q->attention_bias);
  REQUIRE_FALSE(q->o_bias);
  REQUIRE(q->layer_window == std::vector<int64_t>{0, 0, 100, 100});
  REQUIRE_FALSE(q->qk_norm);
  // Qwen3-0.6B's config: a head_dim of its own, q/k norms, no bias.
  auto q3 = ModelConfig::FromJson(R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
    "max_window_layers": 28, "rope_theta": 1000000, "tie_word_embeddings": true})", "q3.json");
  REQUIRE(q3.ok());
  REQUIRE(q3->qk_norm);
  REQUIRE(q3->head_dim == 128);
  REQUIRE(q3->q_dim() == 2048);
  REQUIRE_FALSE(q3->attention_bias);
  REQUIRE(q3->layer_window == std::vector<int64_t>(28, 0));
}

TEST_CASE("Gemma-3's text config: layer kinds, two RoPEs, its scales, soft-capping where set", "[config]") {
  // gemma-3-1b-it's text config (its fields that duet reads).
  const std::string base = R"("model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152,
    "intermediate_size": 6912, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512, "rope_theta": 1000000,
    "rope_local_base_freq": 10000, "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": null,
    "attn_logit_softcapping": null)";
  auto g = ModelConfig::FromJson("{" + base + R"(, "sliding_window_pattern": 6, "rope_scaling": null})", "g.json");
  REQUIRE(g.ok());
  CHECK(g->gemma_norms);
  CHECK(g->qk_norm);
  CHECK(g->tie_word_embeddings);
  CHECK(g->mlp_activation == ModelConfig::Activation::kGeluTanh);
  CHECK(g->embed_scale == Approx(std::sqrt(1152.0)).epsilon(1e-6));  // no torch_dtype: float
  auto bf = ModelConfig::FromJson("{" + base + R"(, "torch_dtype": "bfloat16"})", "bf.json");
  REQUIRE(bf.ok());
  CHECK(bf->embed_scale == 34.0);  // sqrt(1152) = 33.94 in bfloat16, as Hugging Face multiplies
  CHECK(g->AttentionScale() == Approx(1.0 / 16));
  // Every sixth layer global: layers 5 (and 11, ...); the others local.
  CHECK(g->layer_window == std::vector<int64_t>{512, 512, 512, 512, 512, 0, 512, 512});
  CHECK(g->LayerRope(0).theta == 10000);
  CHECK(g->LayerRope(5).theta == 1000000);
  // layer_types, when given, names each layer; linear RoPE scaling (4B and up).
  auto t = ModelConfig::FromJson("{" + base + R"(, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]})", "t.json");
  REQUIRE(t.ok());
  CHECK(t->layer_window == std::vector<int64_t>{0, 512, 512, 512, 512, 512, 0, 512});
  CHECK(t->LayerRope(0).linear_factor == 8.0);
  CHECK(t->LayerRope(1).linear_factor == 1.0);
  CHECK(t->final_softcap == 0);
  CHECK(t->attn_softcap == 0);
  auto capped = ModelConfig::FromJson(R"({"model_type": "gemma3_text", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0})", "c.json");
  REQUIRE(capped.ok());
  CHECK(capped->final_softcap == 30.0);
  CHECK(capped->attn_softcap == 50.0);
  auto negative = ModelConfig::FromJson(R"({"model_type": "gemma3_text", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "final_logit_softcapping": -1})",
                                        "c.json");
  CHECK_THAT(std::string(negative.status().message()), Contains("final_logit_softcapping"));
}

TEST_CASE("yarn rope_scaling, as Qwen3's model card sets it for 131072 tokens", "[config]") {
  const std::string base = R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 32, "max_position_embeddings": 131072, )";
  auto c = ModelConfig::FromJson(base + R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 32768}})", "c.json");
  REQUIRE(c.ok());
  CHECK(c->rope.yarn_factor == 4.0);
  CHECK(c->rope.yarn_original_max_position == 32768.0);
  CHECK(c->rope.yarn_attention_factor == Approx(0.1 * std::log(4.0) + 1));
  CHECK(c->rope.ScoreFactor() == Approx(std::pow(0.1 * std::log(4.0) + 1, 2)));
  // The first dimensions (fast rotations) keep their frequency, the last
  // are factor times slower.
  const std::vector<float> plain = kernels::RopeInvFreq({.head_dim = 32, .theta = 10000});
  const std::vector<float> yarn = kernels::RopeInvFreq(c->rope);
  CHECK(yarn[0] == plain[0]);
  CHECK(yarn[15] == Approx(plain[15] / 4).epsilon(1e-6));
  auto given = ModelConfig::FromJson(base + R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "attention_factor": 1.5}})", "c.json");
  REQUIRE(given.ok());
  CHECK(given->rope.yarn_attention_factor == 1.5);
  CHECK(given->rope.yarn_original_max_position == 131072.0);  // max_position_embeddings when unset
  auto bad = ModelConfig::FromJson(base + R"("rope_scaling": {"rope_type": "yarn"}})", "c.json");
  CHECK_THAT(std::string(bad.status().message()), Contains("rope_scaling.factor"));
}

TEST_CASE("a multimodal Gemma-3 config (gemma-3-4b-it's) is read as its text model", "[config]") {
  // As published: most text fields left to Gemma3TextConfig's defaults, the
  // token ids at the top level.
  auto c = ModelConfig::FromJson(R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model"}})",
                                 "config.json");
  REQUIRE(c.ok());
  CHECK(c->tensor_prefix == "language_model.");
  CHECK(c->model_type == "gemma3_text");
  CHECK(c->vocab_size == 262208);
  CHECK(c->num_heads == 8);
  CHECK(c->num_kv_heads == 4);
  CHECK(c->head_dim == 256);
  CHECK(c->layer_window[0] == 1024);
  CHECK(c->layer_window[5] == 0);  // every sixth layer global
  CHECK(c->rope.linear_factor == 8.0);
  CHECK(c->IsEos(106));
  CHECK(c->tie_word_embeddings);
  CHECK(c->embed_scale == Approx(std::sqrt(2560.0)).epsilon(0.01));  // in bf16
  // 4.3B parameters with the vision tower; its text model's 3.88B.
  CHECK(std::abs(c->NumParameters() / 1e9 - 3.88) < 0.01);
  auto bad = ModelConfig::FromJson(R"({"model_type": "gemma3"})", "config.json");
  CHECK_THAT(std::string(bad.status().message()), Contains("text_config"));
}

TEST_CASE("mixtures of experts: Qwen3-30B-A3B's and Mixtral-8x7B's configs, sparse layers, sizes", "[config]") {
  auto q = ModelConfig::FromJson(R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": false,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "attention_bias": false})", "config.json");
  REQUIRE(q.ok());
  CHECK(q->qk_norm);
  CHECK(q->NumMoeLayers() == 48);
  CHECK(q->norm_topk_prob);
  CHECK(q->RouterName(3) == "model.layers.3.mlp.gate.weight");
  CHECK(q->ExpertTensorNames(3, 127).down == "model.layers.3.mlp.experts.127.down_proj.weight");
  // As published: 30.5B parameters, 3.3B of them active.
  CHECK(std::abs(q->NumParameters() / 1e9 - 30.53) < 0.01);
  CHECK(std::abs(q->NumActiveParameters() / 1e9 - 3.35) < 0.01);

  auto m = ModelConfig::FromJson(R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null, "rope_theta": 1000000.0,
    "max_position_embeddings": 32768})", "config.json");
  REQUIRE(m.ok());
  CHECK(m->moe_intermediate_size == 14336);
  CHECK(m->norm_topk_prob);  // Mixtral's softmax over the chosen two.
  CHECK(m->layer_window == std::vector<int64_t>(32, 0));
  CHECK(m->ExpertTensorNames(0, 7).gate == "model.layers.0.block_sparse_moe.experts.7.w1.weight");
  CHECK(m->ExpertTensorNames(0, 7).up == "model.layers.0.block_sparse_moe.experts.7.w3.weight");
  CHECK(std::abs(m->NumParameters() / 1e9 - 46.70) < 0.01);  // 46.7B, 12.9B active
  CHECK(std::abs(m->NumActiveParameters() / 1e9 - 12.88) < 0.01);

  // Dense layers: mlp_only_layers, and every decoder_sparse_step-th layer sparse.
  const std::string base = R"({"model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_experts": 4, )";
  auto sparse = ModelConfig::FromJson(base + R"("num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3]})", "c.json");
  REQUIRE(sparse.ok());
  CHECK(sparse->layer_moe == std::vector<bool>{false, true, false, false, false, true});
  CHECK_FALSE(sparse->norm_topk_prob);
  auto bad = ModelConfig::FromJson(base + R"("num_experts_per_tok": 2, "mlp_only_layers": [6]})", "c.json");
  CHECK_THAT(std::string(bad.status().message()), Contains("mlp_only_layers") && Contains("0..5"));
  auto many = ModelConfig::FromJson(base + R"("num_experts_per_tok": 5})", "c.json");
  CHECK_THAT(std::string(many.status().message()), Contains("exceeds the experts (4)"));
}

TEST_CASE("bad configs name the file and the field", "[config]") {
  auto bad = [](const std::string& json) { return ModelConfig::FromJson(json, "/m/config.json").status(); };
  auto s = bad("{");
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Contains("/m/config.json"));
  s = bad("[1]");
  REQUIRE_THAT(std::string(s.message()), Contains("object"));
  s = bad(R"({"model_type": "llama", "vocab_size": 10})");
  REQUIRE_THAT(std::string(s.message()), Contains("hidden_size"));
  s = bad(R"({"model_type": "llama", "vocab_size": -1, "hidden_size": 8})");
  REQUIRE_THAT(std::string(s.message()), Contains("vocab_size"));
  s = bad(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn"}})");
  REQUIRE_THAT(std::string(s.message()), Contains("yarn"));
  s = bad(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 99})");
  REQUIRE_THAT(std::string(s.message()), Contains("eos_token_id"));
}

std::string WriteConfig(const std::string& name, const std::string& json) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + ".json";
  std::ofstream(path) << json;
  return path;
}

TEST_CASE("the planner's shape: any architecture, under either field name", "[config]") {
  // OPT-13B's own names (ffn_dim), an architecture the engine refuses.
  const std::string opt = WriteConfig("opt", R"({"model_type": "opt", "num_hidden_layers": 40, "hidden_size": 5120,
      "num_attention_heads": 40, "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048})");
  REQUIRE_FALSE(ModelConfig::FromFile(opt).ok());
  auto o = ModelConfig::ShapeFromFile(opt);
  REQUIRE(o.ok());
  CHECK(o->model_type == "opt");
  CHECK(o->num_layers == 40);
  CHECK(o->intermediate_size == 20480);
  CHECK(o->num_kv_heads == 40);
  CHECK(o->head_dim == 128);
  // GPT-2's: n_layer, n_embd, n_head, n_positions; no MLP width: 4 x hidden.
  auto g = ModelConfig::ShapeFromFile(WriteConfig("gpt2", R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768,
      "n_head": 12, "vocab_size": 50257, "n_positions": 1024})"));
  REQUIRE(g.ok());
  CHECK(g->num_layers == 12);
  CHECK(g->hidden_size == 768);
  CHECK(g->intermediate_size == 3072);
  CHECK(g->max_position_embeddings == 1024);
  // A required field missing, or of the wrong type, is named.
  auto bad = ModelConfig::ShapeFromFile(WriteConfig("bad", R"({"n_layer": 12, "n_embd": 768, "vocab_size": 10})"));
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Contains("num_attention_heads"));
  auto typed = ModelConfig::ShapeFromFile(
      WriteConfig("typed", R"({"n_layer": 12, "n_embd": "768", "n_head": 12, "vocab_size": 10})"));
  CHECK_THAT(std::string(typed.status().message()), Contains("n_embd"));
}

TEST_CASE("generation_config.json beside config.json: its EOS ids join, its sampling fields are defaults",
          "[config]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / "with_generation_config";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "qwen3", "vocab_size": 200, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 151,
      "max_position_embeddings": 64})";
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 150, "eos_token_id": [151, 152],
      "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})";
  for (auto load : {&ModelConfig::FromFile, &ModelConfig::ServingFromFile}) {
    auto c = load((dir / "config.json").string());
    INFO(c.status());
    REQUIRE(c.ok());
    CHECK(c->eos_token_ids == std::vector<int32_t>{151, 152});
    CHECK(c->IsEos(152));
    CHECK(c->bos_token_id == 150);
    CHECK(c->sampling_defaults.temperature == 0.6);
    CHECK(c->sampling_defaults.top_p == 0.95);
    CHECK(c->sampling_defaults.top_k == 20);
    CHECK_FALSE(c->sampling_defaults.min_p.has_value());
  }
  std::ofstream(dir / "generation_config.json") << R"({"temperature": "hot"})";
  auto bad = ModelConfig::FromFile((dir / "config.json").string());
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Contains("generation_config.json"));
  CHECK_THAT(std::string(bad.status().message()), Contains("temperature"));
}

}  // namespace
}  // namespace duet::spec

#include "spec/model_config.h"

#include <catch2/catch.hpp>

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

}  // namespace
}  // namespace duet::spec

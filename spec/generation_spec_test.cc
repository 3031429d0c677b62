#include "spec/generation_spec.h"

#include <catch2/catch.hpp>
#include <string>

namespace duet::spec {
namespace {

spec::ModelConfig Config() {
  spec::ModelConfig c;
  c.vocab_size = 100;
  c.max_position_embeddings = 16;
  return c;
}

proto::GenerationSpec Valid() {
  proto::GenerationSpec s;
  for (int i = 0; i < 5; ++i) s.add_prompt_ids(10 + i);
  s.mutable_sampling()->set_top_p(1.0f);
  s.set_max_tokens(4);
  return s;
}

std::string Refusal(const proto::GenerationSpec& s) {
  absl::StatusOr<spec::GenerationParams> p = ParamsFromSpec(s, Config());
  REQUIRE(p.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

TEST_CASE("sampling params are taken literally", "[worker][generation_spec]") {
  proto::GenerationSpec spec = Valid();
  proto::SamplingParams& p = *spec.mutable_sampling();
  p.set_temperature(0.5f);
  p.set_top_k(7);
  p.set_top_p(0.9f);
  p.set_min_p(0.1f);
  p.set_seed(123);
  p.set_logprobs(2);
  spec::SamplingParams e = ToGenerationParams(spec).sampling;
  REQUIRE(e.temperature == 0.5f);
  REQUIRE(e.top_k == 7);
  REQUIRE(e.top_p == 0.9f);
  REQUIRE(e.min_p == 0.1f);
  REQUIRE(e.seed == 123);
  REQUIRE(e.logprobs == 2);
}

TEST_CASE("the spec's generation fields carry over", "[worker][generation_spec]") {
  proto::GenerationSpec spec = Valid();
  spec.set_max_tokens(9);
  spec.set_min_tokens(3);
  spec.set_ignore_eos(true);
  spec.add_stop_token_ids(42);
  spec.add_stop_token_ids(7);
  spec.set_choice_index(5);
  absl::StatusOr<spec::GenerationParams> p = ParamsFromSpec(spec, Config());
  REQUIRE(p.ok());
  CHECK(p->max_tokens == 9);
  CHECK(p->min_tokens == 3);
  CHECK(p->ignore_eos);
  CHECK(p->stop_token_ids == std::vector<int32_t>{42, 7});
  CHECK(p->choice_index == 5);
}

TEST_CASE("a spec outside the contract is refused, naming the field", "[worker][generation_spec]") {
  proto::GenerationSpec s = Valid();
  s.clear_prompt_ids();
  CHECK(Refusal(s).find("prompt is empty") != std::string::npos);
  s = Valid();
  s.set_prompt_ids(2, 100);
  CHECK(Refusal(s) == "prompt_ids[2] = 100 is outside the vocabulary of 100");
  s = Valid();
  s.set_max_tokens(0);  // "No limit" is not a max_tokens: the router fills in the context's room.
  CHECK(Refusal(s) == "max_tokens must be >= 1, got 0");
  s = Valid();
  s.set_min_tokens(5);
  CHECK(Refusal(s) == "min_tokens must be in [0, max_tokens = 4], got 5");
  s = Valid();
  s.mutable_sampling()->set_top_p(0);  // Proto zero taken literally: invalid.
  CHECK(Refusal(s).find("top_p") != std::string::npos);
  s = Valid();
  s.mutable_sampling()->set_presence_penalty(5);
  CHECK(Refusal(s).find("penalties must be in [-2, 2]: presence_penalty") != std::string::npos);
}

}  // namespace
}  // namespace duet::spec

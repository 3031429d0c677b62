#include "prefill/request.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/status/status.h"
#include "spec/generation_spec.h"

namespace duet::prefill {
namespace {

spec::ModelConfig Config() {
  spec::ModelConfig c;
  c.vocab_size = 100;
  c.max_position_embeddings = 16;
  c.eos_token_ids = {2};
  return c;
}

proto::PrefillRequest Valid() {
  proto::PrefillRequest r;
  r.set_request_id(7);
  for (int i = 0; i < 5; ++i) r.mutable_spec()->add_prompt_ids(10 + i);
  r.mutable_spec()->mutable_sampling()->set_top_p(1.0f);
  r.mutable_spec()->set_max_tokens(4);
  r.set_decode_address("127.0.0.1:9");
  return r;
}

void RequireInvalid(const proto::PrefillRequest& r, const std::string& needle) {
  absl::Status s = ValidatePrefillRequest(r, Config());
  INFO(s.ToString());
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(s.message()).find(needle) != std::string::npos);
}

TEST_CASE("valid requests pass; each malformed field is named", "[prefill][request]") {
  REQUIRE(ValidatePrefillRequest(Valid(), Config()).ok());

  auto r = Valid();
  r.mutable_spec()->clear_prompt_ids();
  RequireInvalid(r, "prompt is empty");

  r = Valid();
  r.mutable_spec()->set_prompt_ids(2, 100);
  RequireInvalid(r, "prompt_ids[2] = 100");

  r = Valid();
  r.add_resume_ids(-1);
  RequireInvalid(r, "resume_ids[0] = -1");

  r = Valid();
  for (int i = 0; i < 11; ++i) r.mutable_spec()->add_prompt_ids(1);  // 16 ok, 17 not
  REQUIRE(ValidatePrefillRequest(r, Config()).ok());
  r.add_resume_ids(1);
  RequireInvalid(r, "more than the model's context of 16");

  r = Valid();
  r.mutable_spec()->mutable_sampling()->set_top_p(0.0f);
  RequireInvalid(r, "top_p");

  r = Valid();
  r.mutable_spec()->mutable_sampling()->set_temperature(-1.0f);
  RequireInvalid(r, "temperature");

  r = Valid();
  r.mutable_spec()->set_max_tokens(0);
  RequireInvalid(r, "max_tokens must be >= 1");

  r = Valid();
  r.mutable_spec()->set_min_tokens(5);
  RequireInvalid(r, "min_tokens");

  r = Valid();
  for (int i = 0; i < 4; ++i) r.add_resume_ids(3);
  RequireInvalid(r, "resume_ids has 4 tokens");

  r = Valid();
  r.clear_decode_address();
  RequireInvalid(r, "decode_address");
  r.mutable_spec()->set_max_tokens(1);  // Token 1 is its last: no decode needed.
  REQUIRE(ValidatePrefillRequest(r, Config()).ok());
}

TEST_CASE("first-token end rules follow Generate, min_tokens and resume_ids", "[prefill][request]") {
  const auto c = Config();
  auto r = Valid();
  auto end = [&](int32_t token) { return DecideFirstTokenEnd(r, spec::ToGenerationParams(r.spec()), c, token); };
  REQUIRE(end(50) == spec::FinishDecision::kContinue);
  REQUIRE(end(2) == spec::FinishDecision::kStop);  // EOS

  r.mutable_spec()->set_ignore_eos(true);
  REQUIRE(end(2) == spec::FinishDecision::kContinue);
  r.mutable_spec()->add_stop_token_ids(50);
  REQUIRE(end(50) == spec::FinishDecision::kStop);  // stop ids ignore ignore_eos

  r = Valid();
  r.mutable_spec()->set_min_tokens(2);
  REQUIRE(end(2) == spec::FinishDecision::kContinue);  // EOS before min_tokens
  r.add_resume_ids(40);  // Token 1 of this attempt is the request's second.
  REQUIRE(end(2) == spec::FinishDecision::kStop);

  r = Valid();
  r.mutable_spec()->set_max_tokens(1);
  REQUIRE(end(50) == spec::FinishDecision::kLength);
  REQUIRE(end(2) == spec::FinishDecision::kStop);  // stop wins, as in Generate
  r.mutable_spec()->set_max_tokens(3);
  r.add_resume_ids(40);
  REQUIRE(end(50) == spec::FinishDecision::kContinue);
  r.add_resume_ids(41);
  REQUIRE(end(50) == spec::FinishDecision::kLength);

  // Context 16: after 14 prompt tokens, token 1 (position 14) leaves room
  // for one more; after 15 it fills the context.
  r = Valid();
  r.mutable_spec()->set_max_tokens(100);
  for (int i = 0; i < 9; ++i) r.mutable_spec()->add_prompt_ids(1);
  REQUIRE(end(50) == spec::FinishDecision::kContinue);
  r.mutable_spec()->add_prompt_ids(1);
  REQUIRE(end(50) == spec::FinishDecision::kLength);
}

TEST_CASE("accepting converts the spec once: parameters, the resumed end, then the checks", "[prefill][request]") {
  auto r = Valid();
  r.mutable_spec()->mutable_sampling()->set_temperature(0.5f);
  r.mutable_spec()->set_choice_index(2);
  absl::StatusOr<AcceptedRequest> a = AcceptPrefillRequest(r, Config());
  REQUIRE(a.ok());
  CHECK(a->end == spec::FinishDecision::kContinue);
  CHECK(a->params.sampling.temperature == 0.5f);
  CHECK(a->params.choice_index == 2);
  CHECK(a->params.max_tokens == 4);

  // The max_tokens-th token resumed: ended, not refused (ValidatePrefillRequest
  // refuses it, having nothing left to generate), STOP when it is an EOS.
  r = Valid();
  for (int32_t t : {11, 12, 13, 2}) r.add_resume_ids(t);
  a = AcceptPrefillRequest(r, Config());
  REQUIRE(a.ok());
  CHECK(a->end == spec::FinishDecision::kStop);
  CHECK(!ValidatePrefillRequest(r, Config()).ok());
  r.set_resume_ids(3, 14);
  a = AcceptPrefillRequest(r, Config());
  REQUIRE(a.ok());
  CHECK(a->end == spec::FinishDecision::kLength);

  // A request that goes on is checked as ValidatePrefillRequest checks it.
  r = Valid();
  r.clear_decode_address();
  a = AcceptPrefillRequest(r, Config());
  CHECK(a.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(a.status().message() == "decode_address is empty");
  r = Valid();
  r.mutable_spec()->mutable_sampling()->set_top_p(0.0f);
  CHECK(AcceptPrefillRequest(r, Config()).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::prefill

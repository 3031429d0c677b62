#include "router/completions.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "router/test_model.h"

namespace duet::router {
namespace {

using nlohmann::json;

struct Model {
  Model() {
    dir = testing::TinyModelDir();
    tok = std::move(engine::Tokenizer::Load(dir)).value();
    format = std::move(engine::PromptFormat::Load(dir)).value();
    served = {.name = "tiny", .tokenizer = tok.get(), .format = &format, .max_model_len = 64};
  }
  std::string dir;
  std::unique_ptr<engine::Tokenizer> tok;
  engine::PromptFormat format;
  ServedModel served;
};

Model& M() {
  static Model m;
  return m;
}

TEST_CASE("bad request bodies are 400 (or 404) naming the parameter") {
  struct Case {
    std::string body;
    int status;
    std::string param;  // "" = null
  };
  const std::string ids64 = [] {
    json a = json::array();
    for (int i = 0; i < 64; ++i) a.push_back(5);
    return a.dump();
  }();
  const std::vector<Case> cases = {
      {"not json", 400, ""},
      {"[1, 2]", 400, ""},
      {R"({"prompt": "hi"})", 400, "model"},
      {R"({"model": 5, "prompt": "hi"})", 400, "model"},
      {R"({"model": "other", "prompt": "hi"})", 404, "model"},
      {R"({"model": "tiny"})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": 5})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": []})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [1, "a"]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [-1]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [100000]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": ["a", "b"]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": {"text": "a"}})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": )" + ids64 + "}", 400, "prompt"},  // Fills the whole context.
      {R"({"model": "tiny", "prompt": "hi", "max_tokens": "abc"})", 400, "max_tokens"},
      {R"({"model": "tiny", "prompt": "hi", "max_tokens": 0})", 400, "max_tokens"},
      {R"({"model": "tiny", "prompt": "hi", "max_tokens": -3})", 400, "max_tokens"},
      {R"({"model": "tiny", "prompt": "hi", "max_tokens": 1.5})", 400, "max_tokens"},
      {R"({"model": "tiny", "prompt": "hi", "max_tokens": 99999999999})", 400, "max_tokens"},
      {R"({"model": "tiny", "prompt": "hi", "temperature": "hot"})", 400, "temperature"},
      {R"({"model": "tiny", "prompt": "hi", "temperature": -0.1})", 400, "temperature"},
      {R"({"model": "tiny", "prompt": "hi", "temperature": 2.5})", 400, "temperature"},
      {R"({"model": "tiny", "prompt": "hi", "top_p": 0})", 400, "top_p"},
      {R"({"model": "tiny", "prompt": "hi", "top_p": 1.01})", 400, "top_p"},
      {R"({"model": "tiny", "prompt": "hi", "top_p": [1]})", 400, "top_p"},
      {R"({"model": "tiny", "prompt": "hi", "top_k": -2})", 400, "top_k"},
      {R"({"model": "tiny", "prompt": "hi", "top_k": 2.5})", 400, "top_k"},
      {R"({"model": "tiny", "prompt": "hi", "min_p": 1.5})", 400, "min_p"},
      {R"({"model": "tiny", "prompt": "hi", "min_p": -0.5})", 400, "min_p"},
      {R"({"model": "tiny", "prompt": "hi", "logprobs": 21})", 400, "logprobs"},
      {R"({"model": "tiny", "prompt": "hi", "logprobs": -1})", 400, "logprobs"},
      {R"({"model": "tiny", "prompt": "hi", "logprobs": true})", 400, "logprobs"},
      {R"({"model": "tiny", "prompt": "hi", "seed": "x"})", 400, "seed"},
      {R"({"model": "tiny", "prompt": "hi", "seed": 1.5})", 400, "seed"},
      {R"({"model": "tiny", "prompt": "hi", "stream": "yes"})", 400, "stream"},
      {R"({"model": "tiny", "prompt": "hi", "stream": 1})", 400, "stream"},
      {R"({"model": "tiny", "prompt": "hi", "ignore_eos": "no"})", 400, "ignore_eos"},
      {R"({"model": "tiny", "prompt": "hi", "n": 2})", 400, "n"},
      {R"({"model": "tiny", "prompt": "hi", "stream_options": 5})", 400, "stream_options"},
      {R"({"model": "tiny", "prompt": "hi", "presence_penalty": 3})", 400, "presence_penalty"},
      {R"({"model": "tiny", "prompt": "hi", "stop": ["x"]})", 400, "stop"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    auto r = ParseCompletionRequest(c.body, M().served, 1);
    REQUIRE_FALSE(r.ok());
    CHECK(HttpStatusFor(r.status()) == c.status);
    CHECK(ErrorParam(r.status()) == c.param);
    json err = json::parse(ErrorJson(r.status()));
    REQUIRE(err.contains("error"));
    CHECK(err["error"]["message"].get<std::string>() == std::string(r.status().message()));
    CHECK(err["error"]["type"] == "invalid_request_error");
    if (c.param.empty()) {
      CHECK(err["error"]["param"].is_null());
    } else {
      CHECK(err["error"]["param"] == c.param);
    }
    if (c.status == 404) {
      CHECK(err["error"]["code"] == "model_not_found");
    } else {
      CHECK(err["error"]["code"].is_null());
    }
  }
}

TEST_CASE("defaults and a text prompt with the model's BOS") {
  auto r = ParseCompletionRequest(R"({"model": "tiny", "prompt": "Hello world", "top_p": null})", M().served, 77);
  REQUIRE(r.ok());
  REQUIRE(M().format.add_bos_token());  // The tiny llama adds BOS to completions.
  auto want = M().tok->Encode(M().format.bos_token() + "Hello world");
  REQUIRE(want.ok());
  CHECK(std::vector<int32_t>(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end()) == *want);
  CHECK(r->spec.prompt_ids(0) == M().tok->TokenToId(M().format.bos_token()));
  CHECK(r->spec.max_tokens() == 16);
  CHECK(r->spec.sampling().temperature() == 1.0f);
  CHECK(r->spec.sampling().top_p() == 1.0f);
  CHECK(r->spec.sampling().top_k() == 0);
  CHECK(r->spec.sampling().min_p() == 0.0f);
  CHECK(r->spec.sampling().seed() == 77);
  CHECK(r->spec.sampling().logprobs() == 0);
  CHECK(r->logprobs == -1);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->spec.ignore_eos());
}

TEST_CASE("explicit parameters and a token-id prompt pass through") {
  auto r = ParseCompletionRequest(
      R"({"model": "tiny", "prompt": [3, 4, 5], "max_tokens": 7, "temperature": 0, "top_p": 0.5,
          "top_k": -1, "min_p": 0.1, "seed": 12345, "logprobs": 3, "stream": true, "ignore_eos": true,
          "stream_options": {"include_usage": true}})",
      M().served, 1);
  REQUIRE(r.ok());
  CHECK(std::vector<int32_t>(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end()) ==
        std::vector<int32_t>{3, 4, 5});  // Token prompts get no BOS.
  CHECK(r->spec.max_tokens() == 7);
  CHECK(r->spec.sampling().temperature() == 0.0f);
  CHECK(r->spec.sampling().top_p() == 0.5f);
  CHECK(r->spec.sampling().top_k() == 0);
  CHECK(r->spec.sampling().min_p() == 0.1f);
  CHECK(r->spec.sampling().seed() == 12345);
  CHECK(r->spec.sampling().logprobs() == 3);
  CHECK(r->logprobs == 3);
  CHECK(r->stream);
  CHECK(r->include_usage);
  CHECK(r->spec.ignore_eos());
  // A one-element batch is one prompt.
  auto one = ParseCompletionRequest(R"({"model": "tiny", "prompt": [[3, 4]]})", M().served, 1);
  REQUIRE(one.ok());
  CHECK(one->spec.prompt_ids_size() == 2);
}

proto::Token Tok(int32_t id, float lp, std::vector<std::pair<int32_t, float>> top = {}) {
  proto::Token t;
  t.set_id(id);
  t.set_logprob(lp);
  for (auto [i, l] : top) {
    auto* x = t.add_top();
    x->set_id(i);
    x->set_logprob(l);
  }
  return t;
}

TEST_CASE("responses: text from the incremental detokenizer, ids, usage, logprobs") {
  const engine::Tokenizer& tok = *M().tok;
  std::vector<int32_t> ids = tok.Encode("Hello, wörld! ünïcode").value();
  const int32_t eot = tok.TokenToId("<|eot_id|>");
  REQUIRE(eot >= 0);
  ids.push_back(eot);  // Special: in token_ids, not in the text.
  const std::string want_text = tok.Decode(ids, /*skip_special=*/true).value();

  CompletionBuilder stream(&tok, "cmpl-x", 1700000000, "tiny", 2, 5);
  CompletionBuilder whole(&tok, "cmpl-x", 1700000000, "tiny", 2, 5);
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  for (int32_t id : ids) {
    proto::Token t = Tok(id, -0.5f, {{id, -0.5f}, {7, -1.25f}, {8, -3.0f}});
    json chunk = json::parse(stream.AddToken(t, true));
    CHECK(whole.AddToken(t, false).empty());
    CHECK(chunk["id"] == "cmpl-x");
    CHECK(chunk["object"] == "text_completion");
    CHECK(chunk["created"] == 1700000000);
    CHECK(chunk["model"] == "tiny");
    const json& c = chunk["choices"][0];
    CHECK(c["index"] == 0);
    CHECK(c["finish_reason"].is_null());
    CHECK(c["token_ids"] == json::array({id}));
    CHECK(c["logprobs"]["tokens"].size() == 1);
    CHECK(c["logprobs"]["token_logprobs"] == json::array({-0.5}));
    CHECK(c["logprobs"]["top_logprobs"][0].size() == 2);  // Top-2 of the 3 sent.
    int64_t chars = 0;  // Offsets count characters, not bytes.
    for (unsigned char ch : streamed) chars += (ch & 0xC0) != 0x80;
    CHECK(c["logprobs"]["text_offset"] == json::array({chars}));
    streamed += c["text"].get<std::string>();
    streamed_ids.push_back(id);
  }
  json final_chunk = json::parse(stream.FinalChunk("stop"));
  streamed += final_chunk["choices"][0]["text"].get<std::string>();
  CHECK(final_chunk["choices"][0]["finish_reason"] == "stop");
  CHECK(final_chunk["choices"][0]["token_ids"] == json::array());
  CHECK(streamed == want_text);
  CHECK(streamed_ids == ids);

  json usage = json::parse(stream.UsageChunk());
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"] == json{{"prompt_tokens", 5}, {"completion_tokens", ids.size()},
                               {"total_tokens", 5 + ids.size()}});

  json body = json::parse(whole.Response("length"));
  const json& c = body["choices"][0];
  CHECK(body["object"] == "text_completion");
  CHECK(c["text"] == want_text);
  CHECK(c["finish_reason"] == "length");
  CHECK(c["token_ids"].get<std::vector<int32_t>>() == ids);
  CHECK(body["usage"]["completion_tokens"] == ids.size());
  const json& lp = c["logprobs"];
  REQUIRE(lp["tokens"].size() == ids.size());
  CHECK(lp["token_logprobs"][0] == -0.5);
  CHECK(lp["top_logprobs"][0][tok.Decode({7}).value()] == -1.25);
  // Offsets count characters of the completion text, starting at 0.
  CHECK(lp["text_offset"][0] == 0);
  for (size_t i = 1; i < ids.size(); ++i) CHECK(lp["text_offset"][i] >= lp["text_offset"][i - 1]);
}

TEST_CASE("no logprobs requested: logprobs is null") {
  CompletionBuilder b(M().tok.get(), "cmpl-y", 1, "tiny", -1, 3);
  json chunk = json::parse(b.AddToken(Tok(40, -0.1f), true));
  CHECK(chunk["choices"][0]["logprobs"].is_null());
  json body = json::parse(b.Response("stop"));
  CHECK(body["choices"][0]["logprobs"].is_null());
  CHECK(body["usage"] == json{{"prompt_tokens", 3}, {"completion_tokens", 1}, {"total_tokens", 4}});
}

}  // namespace
}  // namespace duet::router

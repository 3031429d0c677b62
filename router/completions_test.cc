#include "router/completions.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/testing/tiny_model.h"

namespace duet::router {
namespace {

using nlohmann::json;

struct Model {
  Model() {
    dir = duet::testing::TinyModelDir("llama");
    tok = std::move(text::Tokenizer::Load(dir)).value();
    format = std::move(text::PromptFormat::Load(dir)).value();
    grammars = std::make_unique<grammar::LazyGrammarCache>(
        [this] { return grammar::Vocabulary::FromTokenizer(*tok, {}); }, 16);
    served = {.name = "tiny", .tokenizer = tok.get(), .format = &format, .max_model_len = 64,
              .grammars = grammars.get()};
  }
  std::string dir;
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<grammar::LazyGrammarCache> grammars;
  text::PromptFormat format;
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
      {R"({"model": "tiny", "prompt": [[1, 2], []]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [[1, 2], [100000]]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [[1, 2], 5]})", 400, "prompt"},
      {R"({"model": "tiny", "prompt": [[1], [2]], "cache_boundaries": [1]})", 400, "cache_boundaries"},
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
      {R"({"model": "tiny", "prompt": "hi", "n": 0})", 400, "n"},
      {R"({"model": "tiny", "prompt": "hi", "n": 17})", 400, "n"},
      {R"({"model": "tiny", "prompt": "hi", "user": 5})", 400, "user"},
      {R"({"model": "tiny", "prompt": "hi", "echo": true, "logprobs": 2})", 400, "echo"},
      {R"({"model": "tiny", "prompt": "hi", "stream_options": 5})", 400, "stream_options"},
      {R"({"model": "tiny", "prompt": "hi", "presence_penalty": 3})", 400, "presence_penalty"},
      {R"({"model": "tiny", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", 400, "stop"},
      {R"({"model": "tiny", "prompt": "hi", "stop": [""]})", 400, "stop"},
      {R"({"model": "tiny", "prompt": "hi", "stop": 5})", 400, "stop"},
      {R"({"model": "tiny", "prompt": "hi", "stop": ["a", 5]})", 400, "stop"},
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

// The sampling parameters a parsed request carries.
struct Sampling {
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
  uint64_t seed;
  int32_t logprobs;
};

void CheckSampling(const proto::SamplingParams& got, const Sampling& want) {
  CHECK(got.temperature() == want.temperature);
  CHECK(got.top_p() == want.top_p);
  CHECK(got.top_k() == want.top_k);
  CHECK(got.min_p() == want.min_p);
  CHECK(got.seed() == want.seed);
  CHECK(got.logprobs() == want.logprobs);
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
  CheckSampling(r->spec.sampling(),
                {.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .min_p = 0.0f, .seed = 77, .logprobs = 0});
  CHECK(r->logprobs == -1);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->spec.ignore_eos());
}

TEST_CASE("a checkpoint's sampling defaults (generation_config.json) apply where a request sets none") {
  ServedModel served = M().served;
  served.sampling_defaults = {.temperature = 0.6, .top_p = 0.95, .min_p = 0.0, .top_k = 20};  // Qwen3's
  auto d = ParseCompletionRequest(R"({"model": "tiny", "prompt": "hi", "seed": 5})", served, 1);
  REQUIRE(d.ok());
  CheckSampling(d->spec.sampling(), {.temperature = 0.6f, .top_p = 0.95f, .top_k = 20, .min_p = 0.0f, .seed = 5,
                                     .logprobs = 0});
  auto e = ParseCompletionRequest(R"({"model": "tiny", "prompt": "hi", "seed": 5, "temperature": 0, "top_k": 3})",
                                  served, 1);
  REQUIRE(e.ok());
  CheckSampling(e->spec.sampling(), {.temperature = 0.0f, .top_p = 0.95f, .top_k = 3, .min_p = 0.0f, .seed = 5,
                                     .logprobs = 0});
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
  CheckSampling(r->spec.sampling(),
                {.temperature = 0.0f, .top_p = 0.5f, .top_k = 0, .min_p = 0.1f, .seed = 12345, .logprobs = 3});
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
  const text::Tokenizer& tok = *M().tok;
  std::vector<int32_t> ids = tok.Encode("Hello, wörld! ünïcode").value();
  const int32_t eot = tok.TokenToId("<|eot_id|>");
  REQUIRE(eot >= 0);
  ids.push_back(eot);  // Special: in token_ids, not in the text.
  const std::string want_text = tok.Decode(ids, /*skip_special=*/true).value();

  CompletionRequest params;
  params.logprobs = 2;
  const ResponseEnvelope env{.kind = ApiKind::kCompletion, .id = "cmpl-x", .created = 1700000000,
                             .model = "tiny", .system_fingerprint = "fp_t"};
  ChoiceBuilder stream(&tok, params, 0, params.echo_text);
  ChoiceBuilder whole(&tok, params, 0, params.echo_text);
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  for (int32_t id : ids) {
    proto::Token t = Tok(id, -0.5f, {{id, -0.5f}, {7, -1.25f}, {8, -3.0f}});
    json chunk = json::parse(stream.AddToken(t, env, true));
    CHECK(whole.AddToken(t, env, false).empty());
    CHECK(chunk["system_fingerprint"] == "fp_t");
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
  json final_chunk = json::parse(stream.FinalChunk(env, "stop"));
  streamed += final_chunk["choices"][0]["text"].get<std::string>();
  CHECK(final_chunk["choices"][0]["finish_reason"] == "stop");
  CHECK(final_chunk["choices"][0]["token_ids"] == json::array());
  CHECK(streamed == want_text);
  CHECK(streamed_ids == ids);

  json usage = json::parse(RenderUsageChunk(env, 5, stream.completion_tokens(), /*cached_tokens=*/3));
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"] == json{{"prompt_tokens", 5}, {"completion_tokens", ids.size()},
                               {"total_tokens", 5 + ids.size()},
                               {"prompt_tokens_details", {{"cached_tokens", 3}}}});

  json body = json::parse(RenderResponse(env, {&whole}, {"length"}, 5));
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
  CompletionRequest params;
  const ResponseEnvelope env{.id = "cmpl-y", .created = 1, .model = "tiny"};
  ChoiceBuilder b(M().tok.get(), params, 0, params.echo_text);
  json chunk = json::parse(b.AddToken(Tok(40, -0.1f), env, true));
  CHECK(chunk["choices"][0]["logprobs"].is_null());
  json body = json::parse(RenderResponse(env, {&b}, {"stop"}, 3));
  CHECK(body["choices"][0]["logprobs"].is_null());
  CHECK(body["usage"] == json{{"prompt_tokens", 3}, {"completion_tokens", 1}, {"total_tokens", 4},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}}});
}

// The test model with room for a conversation and its documents.
ServedModel LongContext() {
  ServedModel m = M().served;
  m.max_model_len = 2048;
  return m;
}

// `parse` (ParseCompletionRequest or ParseChatRequest) refuses each body, its
// error naming `param`.
void RequireRefused(absl::StatusOr<CompletionRequest> (*parse)(absl::string_view, const ServedModel&, uint64_t),
                    std::initializer_list<const char*> bodies, const std::string& param) {
  for (const char* body : bodies) {
    INFO(body);
    auto bad = parse(body, LongContext(), 5);
    REQUIRE_FALSE(bad.ok());
    CHECK(ErrorParam(bad.status()) == param);
  }
}

TEST_CASE("completions: a prompt list that mixes strings and token ids is an error that says so") {
  for (const char* body : {R"({"model": "tiny", "prompt": ["abc", 5]})", R"({"model": "tiny", "prompt": [5, [6, 7]]})"}) {
    INFO(body);
    auto r = ParseCompletionRequest(body, LongContext(), 5);
    REQUIRE_FALSE(r.ok());
    CHECK(ErrorParam(r.status()) == "prompt");
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("mixes strings (or lists) and token ids"));
  }
}

TEST_CASE("completions: a prompt batch keeps every prompt, in order, each with its echo text") {
  auto r = ParseCompletionRequest(R"({"model": "tiny", "prompt": ["Once upon", [5, 6, 7], "a"], "n": 2,
                                      "echo": true})",
                                  LongContext(), 5);
  REQUIRE(r.ok());
  CHECK(r->prompts() == 3);
  CHECK(r->n == 2);
  CHECK(std::vector<int32_t>(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end()) ==
        M().tok->Encode(M().format.CompletionPrefix() + "Once upon").value());
  CHECK(r->echo_text == "Once upon");
  REQUIRE(r->more_prompts.size() == 2);
  CHECK(r->more_prompts[0].ids == std::vector<int32_t>{5, 6, 7});
  CHECK(r->more_prompts[0].echo_text == M().tok->Decode({5, 6, 7}, true).value());
  CHECK(r->more_prompts[1].ids == M().tok->Encode(M().format.CompletionPrefix() + "a").value());
  CHECK(r->more_prompts[1].echo_text == "a");
  // One prompt in a list is no batch.
  auto one = ParseCompletionRequest(R"({"model": "tiny", "prompt": [[5, 6]]})", LongContext(), 5);
  REQUIRE(one.ok());
  CHECK(one->prompts() == 1);
  // Errors name the prompt; the sizes are bounded.
  auto bad = ParseCompletionRequest(R"({"model": "tiny", "prompt": [[1, 2], [3, 100000]]})", LongContext(), 5);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("prompt[1][1] = 100000"));
  json many = {{"model", "tiny"}, {"prompt", json::array()}};
  for (int i = 0; i <= kMaxPrompts; ++i) many["prompt"].push_back("x");
  auto too_many = ParseCompletionRequest(many.dump(), LongContext(), 5);
  REQUIRE_FALSE(too_many.ok());
  CHECK(ErrorParam(too_many.status()) == "prompt");
  many["prompt"].erase(many["prompt"].begin());
  many["n"] = kMaxBatchChoices / kMaxPrompts + 1;
  auto too_wide = ParseCompletionRequest(many.dump(), LongContext(), 5);
  REQUIRE_FALSE(too_wide.ok());
  CHECK(ErrorParam(too_wide.status()) == "n");
}

TEST_CASE("top_logprobs: that many distinct tokens, each with its own bytes, also when they are parts of a character") {
  // Byte tokens that are no character on their own: each decodes to U+FFFD.
  const text::Tokenizer& tok = *M().tok;
  std::vector<int32_t> partial;
  for (int32_t id = 0; id < tok.vocab_size() && partial.size() < 3; ++id) {
    auto b = tok.DecodeBytes({id});
    if (b.ok() && b->size() == 1 && static_cast<unsigned char>((*b)[0]) >= 0x80) partial.push_back(id);
  }
  REQUIRE(partial.size() == 3);
  REQUIRE(tok.Decode({partial[0]}).value() == tok.Decode({partial[1]}).value());
  const proto::Token t = Tok(partial[0], -0.5f, {{partial[0], -0.5f}, {partial[1], -1.0f}, {partial[2], -2.0f}});
  auto raw = [&](int32_t id) { return static_cast<int>(static_cast<unsigned char>(tok.DecodeBytes({id}).value()[0])); };
  auto shown = [&](int32_t id) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "bytes:\\x%02x", raw(id));
    return std::string(buf);
  };
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    CompletionRequest params;
    params.kind = kind;
    params.logprobs = 3;
    const ResponseEnvelope env{.kind = kind, .id = "x", .model = "tiny"};
    ChoiceBuilder b(&tok, params, 0, params.echo_text);
    b.AddToken(t, env, false);
    json body = json::parse(RenderResponse(env, {&b}, {"length"}, 1));
    const json& lp = body["choices"][0]["logprobs"];
    if (kind == ApiKind::kChat) {
      const json& e = lp["content"][0];
      CHECK(e["token"] == shown(partial[0]));
      CHECK(e["bytes"] == json::array({raw(partial[0])}));
      REQUIRE(e["top_logprobs"].size() == 3);
      for (int i = 0; i < 3; ++i) {
        CHECK(e["top_logprobs"][i]["token"] == shown(partial[i]));
        CHECK(e["top_logprobs"][i]["bytes"] == json::array({raw(partial[i])}));
      }
      CHECK(e["top_logprobs"][1]["logprob"] == -1.0);
    } else {
      CHECK(lp["tokens"][0] == shown(partial[0]));
      REQUIRE(lp["top_logprobs"][0].size() == 3);
      CHECK(lp["top_logprobs"][0][shown(partial[2])] == -2.0);
    }
  }
}

TEST_CASE("completions: cache_boundaries of a tokenized prompt reach the spec, checked against the prompt") {
  auto r = ParseCompletionRequest(R"({"model": "tiny", "prompt": [5, 6, 7, 8, 9, 10], "cache_boundaries": [2, 5]})",
                                  LongContext(), 5);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->spec.cache_boundaries_size() == 2);
  CHECK(r->spec.cache_boundaries(0) == 2);
  CHECK(r->spec.cache_boundaries(1) == 5);
  RequireRefused(ParseCompletionRequest,
                 {
                     R"({"model": "tiny", "prompt": [5, 6, 7], "cache_boundaries": 2})",
                     R"({"model": "tiny", "prompt": [5, 6, 7], "cache_boundaries": [2, 2]})",
                     R"({"model": "tiny", "prompt": [5, 6, 7], "cache_boundaries": [0]})",
                     R"({"model": "tiny", "prompt": [5, 6, 7], "cache_boundaries": [4]})",
                     R"({"model": "tiny", "prompt": [5, 6, 7], "cache_boundaries": ["1"]})",
                 },
                 "cache_boundaries");
}

TEST_CASE("chat documents: rendered after the system message, the prefix cache's boundaries where each starts") {
  auto r = ParseChatRequest(
      R"({"model": "tiny", "messages": [{"role": "system", "content": "Docs."},
          {"role": "user", "content": "Decode?"}],
          "documents": [{"text": "Prefill."}, {"id": "k7", "title": "D", "text": "Decode."}]})",
      LongContext(), 5);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  const std::vector<text::ChatDocument> docs = {{"", "", "Prefill."}, {"k7", "D", "Decode."}};
  std::vector<size_t> starts;
  const std::string text = M().format.RenderChat({{"system", "Docs."}, {"user", "Decode?"}}, true, docs, &starts).value();
  REQUIRE(starts.size() == 3);
  // The prompt is the whole text's tokens, and each boundary is the token
  // count of the text before a start.
  const std::vector<int32_t> ids(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end());
  CHECK(ids == M().tok->Encode(text).value());
  REQUIRE(r->spec.cache_boundaries_size() == 3);
  for (int k = 0; k < 3; ++k) {
    INFO("boundary " << k);
    CHECK(r->spec.cache_boundaries(k) ==
          static_cast<int32_t>(M().tok->Encode(text.substr(0, starts[static_cast<size_t>(k)])).value().size()));
  }
  CHECK(r->spec.cache_boundaries(0) < r->spec.cache_boundaries(1));
  // Without documents: no boundaries.
  auto plain = ParseChatRequest(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}]})", LongContext(), 5);
  REQUIRE(plain.ok());
  CHECK(plain->spec.cache_boundaries_size() == 0);
  RequireRefused(
      ParseChatRequest,
      {
          R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "documents": "doc"})",
          R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "documents": [7]})",
          R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "documents": [{"title": "t"}]})",
          R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "documents": [{"text": 3}]})",
          R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "documents": [{"text": "a", "id": 4}]})",
      },
      "documents");
  RequireRefused(ParseChatRequest,
                 {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})",
                  R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "a"})"},
                 "chat_template_kwargs");
  // An object passes to the template (the tiny model's reads none of it).
  auto kw = ParseChatRequest(
      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}})",
      LongContext(), 5);
  REQUIRE(kw.ok());
  CHECK(kw->spec.prompt_ids_size() == plain->spec.prompt_ids_size());
}

TEST_CASE("chat requests: messages rendered with the chat template, chat-only fields checked") {
  auto r = ParseChatRequest(
      R"({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
          "max_completion_tokens": 9, "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "n": 3,
          "stop": "END", "user": "u-1", "some_future_field": {"x": 1}})",
      M().served, 5);
  REQUIRE(r.ok());
  CHECK(r->kind == ApiKind::kChat);
  const std::string want = M()
                               .format
                               .RenderChat({{"system", "Be brief."}, {"user", "Hi there"}},
                                           /*add_generation_prompt=*/true)
                               .value();
  CHECK(std::vector<int32_t>(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end()) ==
        M().tok->Encode(want).value());
  CHECK(r->spec.max_tokens() == 9);  // max_completion_tokens wins
  CHECK(r->logprobs == 2);
  CHECK(r->spec.sampling().logprobs() == 2);
  CHECK(r->n == 3);
  CHECK(r->stop == std::vector<std::string>{"END"});

  struct Case {
    std::string body;
    std::string param;
  };
  const std::vector<Case> bad = {
      {R"({"model": "tiny"})", "messages"},
      {R"({"model": "tiny", "messages": []})", "messages"},
      {R"({"model": "tiny", "messages": "hi"})", "messages"},
      {R"({"model": "tiny", "messages": [5]})", "messages"},
      {R"({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]})", "messages"},
      {R"({"model": "tiny", "messages": [{"content": "x"}]})", "messages"},
      {R"({"model": "tiny", "messages": [{"role": "user"}]})", "messages"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": 7}]})", "messages"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": true,
           "top_logprobs": 21})", "top_logprobs"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})",
       "max_completion_tokens"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})",
       "response_format"},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "response_format": "json"})",
       "response_format"},
  };
  // Without a length, chat runs to the context's end (completions: 16);
  // min_tokens is then bounded by nothing but the context.
  for (const char* body : {R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "min_tokens": 30})",
                           R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                               "max_tokens": null, "max_completion_tokens": null, "min_tokens": 30})"}) {
    INFO(body);
    auto open = ParseChatRequest(body, M().served, 1);
    REQUIRE(open.ok());
    REQUIRE(open->spec.prompt_ids_size() > 1);
    CHECK(open->spec.max_tokens() == M().served.max_model_len - open->spec.prompt_ids_size());
    CHECK(open->spec.min_tokens() == 30);
  }
  CHECK(ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "min_tokens": 17})", M().served, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A text response_format is what duet produces anyway.
  CHECK(ParseChatRequest(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "text"}})",
                         M().served, 1)
            .ok());
  for (const Case& c : bad) {
    INFO(c.body);
    auto e = ParseChatRequest(c.body, M().served, 1);
    REQUIRE_FALSE(e.ok());
    CHECK(HttpStatusFor(e.status()) == 400);
    CHECK(ErrorParam(e.status()) == c.param);
  }
}

// Feeds the ids of `text` one at a time; returns the streamed text and the
// non-stream text.
std::pair<std::string, std::string> StreamText(const std::string& text, const CompletionRequest& params,
                                               bool* stopped, int64_t* tokens) {
  const ResponseEnvelope env{.id = "c", .model = "tiny"};
  ChoiceBuilder stream(M().tok.get(), params, 0, params.echo_text);
  ChoiceBuilder whole(M().tok.get(), params, 0, params.echo_text);
  std::string streamed;
  const std::vector<int32_t> ids = M().tok->Encode(text).value();
  for (int32_t id : ids) {
    std::string chunk = stream.AddToken(Tok(id, -0.1f), env, true);
    whole.AddToken(Tok(id, -0.1f), env, false);
    if (chunk.empty()) break;  // after a stop
    streamed += json::parse(chunk)["choices"][0]["text"].get<std::string>();
    if (stream.stopped()) break;
  }
  streamed += json::parse(stream.FinalChunk(env, "stop"))["choices"][0]["text"].get<std::string>();
  *stopped = stream.stopped();
  *tokens = stream.completion_tokens();
  json body = json::parse(RenderResponse(env, {&whole}, {"stop"}, 1));
  return {streamed, body["choices"][0]["text"].get<std::string>()};
}

TEST_CASE("stop strings end the choice and never reach the client, also split across tokens") {
  CompletionRequest params;
  params.stop = {"world peace", "###"};
  bool stopped = false;
  int64_t tokens = 0;
  const std::string text = "Hello there, world peace is near ### and more";
  REQUIRE(M().tok->Encode("world peace").value().size() >= 2);  // split across tokens
  auto [streamed, whole] = StreamText(text, params, &stopped, &tokens);
  CHECK(stopped);
  CHECK(streamed == "Hello there, ");
  CHECK(whole == "Hello there, ");
  // Tokens up to the one that completed the stop string are counted, no more.
  CHECK(tokens == static_cast<int64_t>(M().tok->Encode("Hello there, world peace").value().size()));
  // A prefix of a stop string that never completes is released at the end.
  params.stop = {"nearly"};
  auto [s2, w2] = StreamText("it is near", params, &stopped, &tokens);
  CHECK_FALSE(stopped);
  CHECK(s2 == "it is near");
  CHECK(w2 == "it is near");
  // The earliest match wins.
  params.stop = {"more", "is"};
  auto [s3, w3] = StreamText(text, params, &stopped, &tokens);
  CHECK(stopped);
  CHECK(s3 == "Hello there, world peace ");
}

TEST_CASE("n choices render in order with their finish reasons; usage sums them; chat shape") {
  CompletionRequest params;
  params.kind = ApiKind::kChat;
  params.logprobs = 1;
  const ResponseEnvelope env{.kind = ApiKind::kChat, .id = "chatcmpl-1", .created = 2, .model = "tiny",
                             .system_fingerprint = "fp_x"};
  ChoiceBuilder a(M().tok.get(), params, 0, params.echo_text), b(M().tok.get(), params, 1, params.echo_text);
  const std::vector<int32_t> ids = M().tok->Encode("Good day").value();
  json first = json::parse(a.AddToken(Tok(ids[0], -0.25f, {{ids[0], -0.25f}}), env, true));
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25);
  CHECK(first["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size() == 1);
  for (size_t i = 1; i < ids.size(); ++i) {
    json c = json::parse(a.AddToken(Tok(ids[i], -0.5f), env, true));
    CHECK_FALSE(c["choices"][0]["delta"].contains("role"));
  }
  b.AddToken(Tok(ids[0], -1.0f), env, false);
  json body = json::parse(RenderResponse(env, {&a, &b}, {"stop", "length"}, 4));
  CHECK(body["object"] == "chat.completion");
  CHECK(body["system_fingerprint"] == "fp_x");
  REQUIRE(body["choices"].size() == 2);
  CHECK(body["choices"][0]["index"] == 0);
  CHECK(body["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "Good day"}});
  CHECK(body["choices"][0]["finish_reason"] == "stop");
  CHECK(body["choices"][1]["index"] == 1);
  CHECK(body["choices"][1]["finish_reason"] == "length");
  CHECK(body["choices"][1]["logprobs"]["content"].size() == 1);
  CHECK(body["usage"] == json{{"prompt_tokens", 4}, {"completion_tokens", ids.size() + 1},
                              {"total_tokens", 4 + ids.size() + 1},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}}});
}

TEST_CASE("echo puts the prompt's text before the completion") {
  auto r = ParseCompletionRequest(R"({"model": "tiny", "prompt": "Once upon", "echo": true})", M().served, 1);
  REQUIRE(r.ok());
  CHECK(r->echo_text == "Once upon");
  const ResponseEnvelope env{.id = "c", .model = "tiny"};
  ChoiceBuilder s(M().tok.get(), *r, 0, r->echo_text), w(M().tok.get(), *r, 0, r->echo_text);
  const int32_t id = M().tok->Encode(" a time").value()[0];
  json chunk = json::parse(s.AddToken(Tok(id, -0.1f), env, true));
  w.AddToken(Tok(id, -0.1f), env, false);
  const std::string piece = M().tok->Decode(std::vector<int32_t>{id}).value();
  CHECK(chunk["choices"][0]["text"] == "Once upon" + piece);
  json body = json::parse(RenderResponse(env, {&w}, {"length"}, 3));
  CHECK(body["choices"][0]["text"] == "Once upon" + piece);
}

TEST_CASE("stream chunks are the bytes a JSON library writes, quotes and control characters included") {
  const std::string text = std::string("a \"q\" \\ back\tslash\n\x01\x1f é ✓ \x7f");
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    CompletionRequest params;
    params.kind = kind;
    const ResponseEnvelope env{.kind = kind, .id = "id-\"1\"", .created = 17, .model = "m\\x",
                               .system_fingerprint = "fp"};
    ChoiceBuilder b(M().tok.get(), params, 3, params.echo_text);
    // The first chat chunk (role) takes the general path; the second the direct one.
    if (kind == ApiKind::kChat) b.AddToken(Tok(40, -0.1f), env, true);
    // A token whose text is `text`: feed ids of it one by one, then compare
    // one chunk rendered both ways.
    const std::vector<int32_t> ids = M().tok->Encode(text).value();
    std::string got;
    for (int32_t id : ids) got = b.AddToken(Tok(id, -0.1f), env, true);
    json parsed = json::parse(got);
    json want;
    want["id"] = env.id;
    want["object"] = kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion";
    want["created"] = 17;
    want["model"] = env.model;
    want["system_fingerprint"] = "fp";
    json choice;
    choice["index"] = 3;
    const std::string piece = kind == ApiKind::kChat ? parsed["choices"][0]["delta"].value("content", std::string())
                                                     : parsed["choices"][0]["text"].get<std::string>();
    if (kind == ApiKind::kChat) {
      choice["delta"] = piece.empty() ? json::object() : json{{"content", piece}};
    } else {
      choice["text"] = piece;
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    if (kind == ApiKind::kCompletion) choice["token_ids"] = json::array({ids.back()});
    want["choices"] = json::array({choice});
    nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(want.dump());
    // Key order of the real renderer, then byte equality.
    nlohmann::ordered_json o;
    for (const char* k : {"id", "object", "created", "model", "system_fingerprint", "choices"}) o[k] = ordered[k];
    nlohmann::ordered_json oc;
    for (const char* k : {"index", "delta", "text", "logprobs", "finish_reason", "token_ids"}) {
      if (ordered["choices"][0].contains(k)) oc[k] = ordered["choices"][0][k];
    }
    o["choices"] = nlohmann::ordered_json::array({oc});
    CHECK(got == o.dump());
  }
  // And the text across all chunks is the text.
  CompletionRequest params;
  const ResponseEnvelope env{.id = "c", .model = "tiny"};
  ChoiceBuilder b(M().tok.get(), params, 0, params.echo_text);
  std::string all;
  const std::vector<int32_t> ids = M().tok->Encode(text).value();
  for (int32_t id : ids) all += json::parse(b.AddToken(Tok(id, -0.1f), env, true))["choices"][0]["text"].get<std::string>();
  all += json::parse(b.FinalChunk(env, "stop"))["choices"][0]["text"].get<std::string>();
  CHECK(all == text);
}


// The tiny model's tokenizer with a Hermes-style template that renders
// tools, an assistant's calls and tool results (the newline after a block
// tag is trimmed, as Hugging Face sets Jinja up).
struct ToolModel {
  ToolModel() {
    const std::string tmpl =
        "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>"
        "<|im_end|>\n{% endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{%- for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
        "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}"
        "{%- if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    format = text::PromptFormat::FromTokenizerConfig(json{{"chat_template", tmpl}}.dump(), "tools-config").value();
    served = M().served;
    served.format = &format;
    served.max_model_len = 4096;
  }
  text::PromptFormat format;
  ServedModel served;
};

std::vector<int32_t> Ids(const std::string& text) { return M().tok->Encode(text).value(); }

std::string PromptText(const CompletionRequest& r) {
  return M().tok->Decode(absl::MakeConstSpan(r.spec.prompt_ids().data(), r.spec.prompt_ids().size()), false).value();
}

TEST_CASE("chat tools: definitions, an assistant's calls and tool results render through the template") {
  ToolModel tm;
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  auto r = ParseChatRequest(absl::StrCat(R"({"model": "tiny", "tools": )", tools, R"(, "messages": [
      {"role": "user", "content": "Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})"),
                            tm.served, 1);
  REQUIRE(r.ok());
  CHECK(r->tool_format == ToolFormat::kHermes);
  CHECK(r->max_tool_calls == 0);
  CHECK(PromptText(*r) ==
        "<|im_start|>system\n<tools>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Weather.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
        "\"string\"}}}}}</tools><|im_end|>\n<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n"
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call><|im_end|>\n"
        "<|im_start|>tool\n18 C (for call_1)<|im_end|>\n<|im_start|>assistant\n");

  // tool_choice none: the tools are neither shown nor parsed.
  auto none = ParseChatRequest(absl::StrCat(R"({"model": "tiny", "tool_choice": "none", "tools": )", tools,
                                            R"(, "messages": [{"role": "user", "content": "Paris?"}]})"),
                               tm.served, 1);
  REQUIRE(none.ok());
  CHECK(none->tool_format == ToolFormat::kNone);
  CHECK(PromptText(*none) == "<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n");
  auto one = ParseChatRequest(absl::StrCat(R"({"model": "tiny", "parallel_tool_calls": false, "tools": )", tools,
                                           R"(, "messages": [{"role": "user", "content": "Paris?"}]})"),
                              tm.served, 1);
  REQUIRE(one.ok());
  CHECK(one->max_tool_calls == 1);

  // tool_choice required ends the prompt with a call's opening; naming the
  // function, through its name, and one call at most.
  const std::string asked = "<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n";
  auto required = ParseChatRequest(absl::StrCat(R"({"model": "tiny", "tool_choice": "required", "tools": )", tools,
                                                R"(, "messages": [{"role": "user", "content": "Paris?"}]})"),
                                   tm.served, 1);
  REQUIRE(required.ok());
  CHECK(required->tool_prefix == "<tool_call>\n{\"name\": \"");
  CHECK(absl::EndsWith(PromptText(*required), asked + required->tool_prefix));
  CHECK(required->max_tool_calls == 0);
  auto named = ParseChatRequest(
      absl::StrCat(R"({"model": "tiny", "tool_choice": {"type": "function", "function": {"name": "get_weather"}},)",
                   R"( "tools": )", tools, R"(, "messages": [{"role": "user", "content": "Paris?"}]})"),
      tm.served, 1);
  REQUIRE(named.ok());
  CHECK(named->tool_prefix == "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  CHECK(absl::EndsWith(PromptText(*named), asked + named->tool_prefix));
  CHECK(named->max_tool_calls == 1);
  CHECK(r->tool_prefix.empty());

  struct Case {
    std::string extra;  // fields after "messages"
    std::string messages;
    std::string param;
    const ServedModel* model;
  };
  const std::string user = R"([{"role": "user", "content": "x"}])";
  const std::vector<Case> bad = {
      {R"("tools": {"type": "function"})", user, "tools", &tm.served},
      {R"("tools": [{"type": "function", "function": {"name": "has space"}}])", user, "tools", &tm.served},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])", user, "tools", &tm.served},
      {R"("tools": [{"type": "code_interpreter"}])", user, "tools", &tm.served},
      {absl::StrCat(R"("tool_choice": {"type": "function", "name": "get_weather"}, "tools": )", tools), user,
       "tool_choice", &tm.served},
      {absl::StrCat(R"("tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": )", tools), user,
       "tool_choice", &tm.served},
      {absl::StrCat(R"("tool_choice": "sometimes", "tools": )", tools), user, "tool_choice", &tm.served},
      {R"("tool_choice": "auto")", user, "tool_choice", &tm.served},
      {absl::StrCat(R"("parallel_tool_calls": 1, "tools": )", tools), user, "parallel_tool_calls", &tm.served},
      // The tiny model's own template does not render tools.
      {absl::StrCat(R"("tools": )", tools), user, "tools", &M().served},
      {R"("n": 1)", R"([{"role": "tool", "content": "18 C"}])", "messages", &tm.served},
      {R"("n": 1)", R"([{"role": "user", "content": "x", "tool_calls": []}])", "messages", &tm.served},
      {R"("n": 1)", R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}])", "messages",
       &tm.served},
      {R"("n": 1)", R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
          "arguments": "{not json"}}]}])", "messages", &tm.served},
      {R"("n": 1)", R"([{"role": "assistant"}])", "messages", &tm.served},
      {R"("n": 1)", R"([{"role": "user", "content": "x", "name": 5}])", "messages", &tm.served},
  };
  for (const Case& c : bad) {
    const std::string body = absl::StrCat(R"({"model": "tiny", "messages": )", c.messages, ", ", c.extra, "}");
    INFO(body);
    auto e = ParseChatRequest(body, *c.model, 1);
    REQUIRE_FALSE(e.ok());
    INFO(e.status().message());
    CHECK(HttpStatusFor(e.status()) == 400);
    CHECK(ErrorParam(e.status()) == c.param);
  }
}

TEST_CASE("a thinking model's <think> text goes out as reasoning, streamed and whole; calls parse after it") {
  CompletionRequest params;
  params.kind = ApiKind::kChat;
  params.reasoning = true;
  params.tool_format = ToolFormat::kHermes;
  const ResponseEnvelope env{.kind = ApiKind::kChat, .id = "chatcmpl-8", .created = 2, .model = "tiny"};
  // The thinking mentions a call's tag: only the answer's call is a call.
  const std::string text =
      "<think>\nI could use <tool_call> here.\n</think>\n\nChecking.<tool_call>{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
  for (const std::string field : {"reasoning", "reasoning_content"}) {
    INFO(field);
    params.reasoning_field = field;
    ChoiceBuilder stream(M().tok.get(), params, 0, ""), whole(M().tok.get(), params, 0, "");
    std::string reasoning, content;
    int calls = 0;
    auto take = [&](const json& c) {
      const json& delta = c["choices"][0]["delta"];
      if (delta.contains(field)) reasoning += delta[field].get<std::string>();
      if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls")) calls += static_cast<int>(delta["tool_calls"].size());
    };
    for (int32_t id : Ids(text)) {
      take(json::parse(stream.AddToken(Tok(id, -0.1f), env, true)));
      whole.AddToken(Tok(id, -0.1f), env, false);
    }
    take(json::parse(stream.FinalChunk(env, "stop")));
    CHECK(reasoning == "\nI could use <tool_call> here.\n");
    CHECK(content == "\n\nChecking.");
    CHECK(calls == 1);
    const json body = json::parse(RenderResponse(env, {&whole}, {"stop"}, 3));
    const json& msg = body["choices"][0]["message"];
    CHECK(msg[field] == "\nI could use <tool_call> here.\n");
    CHECK(msg["content"] == "\n\nChecking.");
    CHECK(msg["tool_calls"].size() == 1);
    CHECK(body["choices"][0]["finish_reason"] == "tool_calls");
  }
  // No thinking in the output: reasoning is null, the text all content.
  ChoiceBuilder plain(M().tok.get(), params, 0, "");
  for (int32_t id : Ids("Just the answer.")) plain.AddToken(Tok(id, -0.1f), env, false);
  const json body = json::parse(RenderResponse(env, {&plain}, {"stop"}, 3));
  CHECK(body["choices"][0]["message"]["content"] == "Just the answer.");
  CHECK(body["choices"][0]["message"]["reasoning_content"].is_null());
}

TEST_CASE("chat tools: the output's calls stream as tool_calls deltas and end with finish_reason tool_calls") {
  CompletionRequest params;
  params.kind = ApiKind::kChat;
  params.tool_format = ToolFormat::kHermes;
  const ResponseEnvelope env{.kind = ApiKind::kChat, .id = "chatcmpl-7", .created = 2, .model = "tiny"};
  const std::string text =
      "On it.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}</tool_call>";
  ChoiceBuilder stream(M().tok.get(), params, 0, ""), whole(M().tok.get(), params, 0, "");
  std::string content;
  json calls = json::array();
  for (int32_t id : Ids(text)) {
    json c = json::parse(stream.AddToken(Tok(id, -0.1f), env, true));
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) {
      for (const json& t : delta["tool_calls"]) calls.push_back(t);
    }
    whole.AddToken(Tok(id, -0.1f), env, false);
  }
  json last = json::parse(stream.FinalChunk(env, "stop"));
  CHECK(last["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(content == "On it.");
  REQUIRE(calls.size() == 2);
  CHECK(calls[0]["index"] == 0);
  CHECK(calls[1]["index"] == 1);
  CHECK(calls[0]["type"] == "function");
  CHECK(calls[0]["function"] == json{{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}});
  CHECK(calls[1]["function"] == json{{"name", "get_time"}, {"arguments", "{\"zone\":\"CET\"}"}});
  CHECK(calls[0]["id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(calls[0]["id"] != calls[1]["id"]);

  json body = json::parse(RenderResponse(env, {&whole}, {"stop"}, 3));
  const json& msg = body["choices"][0]["message"];
  CHECK(body["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(msg["content"] == "On it.");
  REQUIRE(msg["tool_calls"].size() == 2);
  for (size_t k = 0; k < 2; ++k) {  // The same calls, ids included, without the stream's index.
    json want = calls[k];
    want.erase("index");
    CHECK(msg["tool_calls"][k] == want);
  }

  // Cut off by max_tokens inside a call: "length", and the open call's text is content.
  ChoiceBuilder cut(M().tok.get(), params, 0, "");
  for (int32_t id : Ids("<tool_call>{\"name\": \"get_w")) cut.AddToken(Tok(id, -0.1f), env, false);
  json cut_body = json::parse(RenderResponse(env, {&cut}, {"length"}, 3));
  CHECK(cut_body["choices"][0]["finish_reason"] == "length");
  CHECK(cut_body["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "<tool_call>{\"name\": \"get_w"}});

  // A forced opening: the output continues it, and is parsed as such.
  CompletionRequest forced = params;
  forced.tool_prefix = ToolCallOpening(ToolFormat::kHermes, "get_weather");
  ChoiceBuilder cont(M().tok.get(), forced, 0, "");
  for (int32_t id : Ids("{\"city\": \"Oslo\"}}\n</tool_call>")) cont.AddToken(Tok(id, -0.1f), env, false);
  json cont_body = json::parse(RenderResponse(env, {&cont}, {"stop"}, 3));
  CHECK(cont_body["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(cont_body["choices"][0]["message"]["content"].is_null());
  CHECK(cont_body["choices"][0]["message"]["tool_calls"][0]["function"] ==
        json{{"name", "get_weather"}, {"arguments", "{\"city\":\"Oslo\"}"}});

  // Only a call: content is null.
  ChoiceBuilder only(M().tok.get(), params, 0, "");
  for (int32_t id : Ids("<tool_call>{\"name\": \"f\"}</tool_call>")) {
    only.AddToken(Tok(id, -0.1f), env, false);
  }
  json only_body = json::parse(RenderResponse(env, {&only}, {"stop"}, 3));
  CHECK(only_body["choices"][0]["message"]["content"].is_null());
  CHECK(only_body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}");
}

}  // namespace
}  // namespace duet::router

namespace duet::router {
namespace {

TEST_CASE("structured outputs: every way to ask for one becomes the spec's grammar; what cannot be enforced is a 400 "
          "naming what and where") {
  struct Ok {
    std::string fields;
    proto::GrammarSpec::Kind kind;
    std::string text;
    bool whitespace = false;
  };
  const std::vector<Ok> ok = {
      {R"("response_format": {"type": "json_object"})", proto::GrammarSpec::GRAMMAR_JSON_SCHEMA, R"({"type":"object"})"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": false,
          "schema": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}})",
       proto::GrammarSpec::GRAMMAR_JSON_SCHEMA,
       R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})"},
      {R"("structured_outputs": {"json": "{\"type\": \"boolean\", \"x-note\": 1}", "whitespace_pattern": "[ ]*"})",
       proto::GrammarSpec::GRAMMAR_JSON_SCHEMA, R"({"type":"boolean","x-note":1})", true},
      {R"("structured_outputs": {"regex": "[a-c]{2}"})", proto::GrammarSpec::GRAMMAR_REGEX, "[a-c]{2}"},
      {R"("structured_outputs": {"grammar": "root ::= \"x\""})", proto::GrammarSpec::GRAMMAR_RULES, R"(root ::= "x")"},
      {R"("structured_outputs": {"json_object": true})", proto::GrammarSpec::GRAMMAR_JSON_SCHEMA, R"({"type":"object"})"},
      {R"("guided_json": {"enum": [1, 2]})", proto::GrammarSpec::GRAMMAR_JSON_SCHEMA, R"({"enum":[1,2]})"},
      {R"("guided_regex": "\\d+")", proto::GrammarSpec::GRAMMAR_REGEX, R"(\d+)"},
      {R"("guided_grammar": "root ::= [0-9]+")", proto::GrammarSpec::GRAMMAR_RULES, "root ::= [0-9]+"},
      {R"("guided_grammar": "start: /[0-9]+/")", proto::GrammarSpec::GRAMMAR_RULES, "start: /[0-9]+/"},
  };
  for (const Ok& c : ok) {
    for (bool chat : {false, true}) {
      const std::string body = chat ? absl::StrCat(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], )",
                                                    c.fields, "}")
                                     : absl::StrCat(R"({"model": "tiny", "prompt": "x", )", c.fields, "}");
      INFO(body);
      auto r = chat ? ParseChatRequest(body, M().served, 1) : ParseCompletionRequest(body, M().served, 1);
      INFO(r.status());
      REQUIRE(r.ok());
      CHECK(r->spec.grammar().kind() == c.kind);
      CHECK(r->spec.grammar().text() == c.text);
      CHECK(r->spec.grammar().whitespace() == c.whitespace);
      CHECK(r->spec.grammar().triggers_size() == 0);  // the tiny template does not think
    }
  }
  auto choice = ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "guided_choice": ["yes", "no"]})",
                                       M().served, 1);
  REQUIRE(choice.ok());
  CHECK(choice->spec.grammar().kind() == proto::GrammarSpec::GRAMMAR_CHOICE);
  CHECK(std::vector<std::string>(choice->spec.grammar().choices().begin(), choice->spec.grammar().choices().end()) ==
        std::vector<std::string>{"yes", "no"});
  auto plain = ParseCompletionRequest(R"({"model": "tiny", "prompt": "x", "response_format": {"type": "text"}})",
                                      M().served, 1);
  REQUIRE(plain.ok());
  CHECK(plain->spec.grammar().kind() == proto::GrammarSpec::GRAMMAR_NONE);

  struct Bad {
    std::string fields;
    std::string param;
    std::string message;  // what the message starts with
  };
  const std::vector<Bad> bad = {
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object",
          "properties": {"a": {"not": {"type": "string"}}}}}})",
       "response_format", "response_format: not at #/properties/a"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": []}}})", "response_format",
       "response_format: enum at #"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": "{\"type\":"}})", "response_format",
       "response_format.json_schema.schema is not a JSON Schema"},
      {R"("response_format": {"type": "json_schema"})", "response_format", "response_format type 'json_schema' needs"},
      {R"("structured_outputs": {"regex": "a(b"})", "structured_outputs", "structured_outputs: regex"},
      {R"("structured_outputs": {"grammar": "root ::= ( \"a\""})", "structured_outputs",
       "structured_outputs: grammar: line 1"},
      {R"("guided_grammar": "start: WORD\n%import common.WORD\n%ignore \" \"\n")", "guided_grammar",
       "guided_grammar: grammar: line 3 column 1: %ignore is not supported"},
      {R"("guided_choice": [])", "guided_choice", "guided_choice is empty"},
      {R"("structured_outputs": {"json": {"type": "string"}, "regex": "a"})", "structured_outputs",
       "the request asks for two output formats"},
      {R"("response_format": {"type": "json_object"}, "guided_regex": "a")", "guided_regex",
       "the request asks for two output formats (response_format and guided_regex)"},
      {R"("structured_outputs": {"structural_tag": "{}"})", "structured_outputs", "structured_outputs.structural_tag"},
  };
  for (const Bad& c : bad) {
    const std::string body = absl::StrCat(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], )",
                                          c.fields, "}");
    INFO(body);
    auto e = ParseChatRequest(body, M().served, 1);
    REQUIRE_FALSE(e.ok());
    INFO(e.status());
    CHECK(HttpStatusFor(e.status()) == 400);
    CHECK(ErrorParam(e.status()) == c.param);
    CHECK(absl::StartsWith(e.status().message(), c.message));
  }
}

}  // namespace
}  // namespace duet::router

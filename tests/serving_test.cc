// The serving path end to end with real processes: a router, prefill and
// decode workers (or colocated ones) serve concurrent completion requests,
// streamed and not, and every output equals engine::Generate (what `duet
// generate` runs) token for token, with logprobs within 1e-4. Afterwards the
// pools are whole: every block free, nothing queued or running.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "http/client.h"
#include "tests/catch_util.h"
#include "tests/cluster.h"
#include "tests/serving_util.h"
#include "text/chat_template.h"
#include "engine/model.h"
#include "engine/precision_map.h"
#include "engine/testing/tiny_model.h"
#include "text/tokenizer.h"

namespace duet::testing {
namespace {


// Sends every request at once (one thread each) and checks each output.
void RunAndCheck(Cluster& c, const std::vector<TestRequest>& reqs, const std::string& model) {
  auto want = ReferenceOutputs(c.model_dir(), reqs);
  const std::vector<ParsedCompletion> got = SendAll(c.http_port(), reqs, model);
  Verdicts v;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string diff = Verify(c.model_dir(), got[i], want[i], reqs[i], &v);
    INFO("request " << i << " (prompt " << reqs[i].prompt.size() << " tokens, max_tokens " << reqs[i].max_tokens
                    << ", temperature " << reqs[i].temperature << ", stream " << reqs[i].stream << "): " << diff);
    REQUIRE(diff.empty());
  }
  WARN(v.exact << " of " << reqs.size() << " outputs equal the reference token for token; " << v.near_tie
                << " took the other branch at a float near-tie and match it teacher-forced");
  REQUIRE(v.exact >= static_cast<int>(reqs.size() * 9 / 10));
}

// Waits until no worker holds a block, a lease or a request.
nlohmann::json WaitIdle(Cluster& c) {
  auto s = PollStats(c.http_port(), AllIdle, absl::Seconds(30));
  if (!s.ok()) FAIL("workers did not drain: " << s.status().message());
  return *s;
}

// The context is a hard limit: prompt + completion never exceed it, and a
// prompt that leaves no room is a 400 naming the lengths.
void CheckContextLimit(Cluster& c, const std::string& model) {
  const int64_t context = 1024;  // the tiny model's
  auto ask = [&](int64_t prompt) {
    const nlohmann::json body = {{"model", model}, {"prompt", std::vector<int32_t>(static_cast<size_t>(prompt), 7)},
                                 {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump());
    REQUIRE(r.ok());
    return std::make_pair(r->status, nlohmann::json::parse(r->body));
  };
  // Finished by prefill (the first token fills the context) and by decode.
  for (const int64_t prompt : {context - 1, context - 4}) {
    INFO("prompt " << prompt);
    const auto [status, j] = ask(prompt);
    REQUIRE(status == 200);
    CHECK(j["usage"]["completion_tokens"] == context - prompt);
    CHECK(j["usage"]["total_tokens"] == context);
    CHECK(j["choices"][0]["finish_reason"] == "length");
  }
  const auto [status, j] = ask(context);
  CHECK(status == 400);
  CHECK_THAT(j["error"]["message"].get<std::string>(),
             Catch::Contains("maximum context length is 1024 tokens, but the prompt has 1024 tokens"));
}

TEST_CASE("disaggregated cluster: 200 concurrent requests equal duet generate", "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  const std::vector<std::string> args = {"--kv-blocks", "1024"};
  REQUIRE(c.Start(model_dir, {{"prefill", "prefill-0", args},
                              {"prefill", "prefill-1", args},
                              {"decode", "decode-0", args},
                              {"decode", "decode-1", args}})
              .ok());
  auto reqs = MixedRequests(200, 1000, 120, 24, 42);
  RunAndCheck(c, reqs, model);

  nlohmann::json stats = WaitIdle(c);
  int64_t moved = 0, blocks = 0, decode_prompt = 0, prefill_prompt = 0;
  for (auto& [id, w] : stats["workers"].items()) {
    if (w["role"] == "decode") {
      moved += w["kv_bytes_moved"].get<int64_t>();
      blocks += w["kv_blocks_transferred"].get<int64_t>();
      decode_prompt += w["prompt_tokens_computed"].get<int64_t>();
      REQUIRE(w["preemptions"] == 0);
    } else {
      prefill_prompt += w["prompt_tokens_computed"].get<int64_t>();
    }
  }
  INFO(stats.dump());
  REQUIRE(decode_prompt == 0);           // Decode ran no prompt token.
  REQUIRE(blocks > 0);
  REQUIRE(moved == blocks * kTinyBlockBytes);  // Whole blocks moved, nothing else.
  int64_t prompt_tokens = 0;
  for (const auto& r : reqs) prompt_tokens += r.prompt.size();
  REQUIRE(prefill_prompt == prompt_tokens);  // Each prompt prefilled exactly once.
  CheckContextLimit(c, model);
}

// LLM-PQ's phase-aware precision: the prefill pool holds the model in BF16
// (the tiny checkpoint's dtype; one layer and lm_head in F16, so that a
// prefill worker that ignored its map would be seen), the decode pool in Q4
// (one layer Q8, lm_head Q4), both with a BF16 KV cache. Every linear layer
// then runs a non-F32 kernel, whose rows do not depend on the batch, so the
// cluster's outputs equal the one-process reference with the same two maps
// token for token; a worker that ignored its map, or KV stored at F32 and
// read at BF16, would differ. Each pull moves half the bytes of an F32 block.
TEST_CASE("phase-aware precision: BF16 prefill and Q4 decode pools with a BF16 KV cache equal duet generate "
          "with the same maps",
          "[serving]") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string prefill_map = dir + "/prefill_bf16.json", decode_map = dir + "/decode_q4.json";
  {
    std::ofstream(prefill_map) << R"({"layers": ["bf16", "f16", "bf16", "bf16"], "embedding": "bf16",
                                      "lm_head": "f16"})";
    std::ofstream(decode_map) << R"({"layers": ["q4", "q4", "q8", "q4"], "lm_head": "q4"})";
  }
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  auto args = [](const std::string& map) {
    return std::vector<std::string>{"--kv-blocks", "512", "--precision-map", map, "--kv-dtype", "bf16"};
  };
  REQUIRE(c.Start(model_dir, {{"prefill", "prefill-0", args(prefill_map)},
                              {"decode", "decode-0", args(decode_map)},
                              {"decode", "decode-1", args(decode_map)}})
              .ok());
  auto reqs = MixedRequests(48, 1000, 100, 16, 21);

  auto load = [&](const std::string& path) {
    engine::LoadOptions o{.kv_dtype = kernels::DType::kBF16};
    if (path.empty()) return o;
    auto map = engine::ReadPrecisionMap(path);
    REQUIRE(map.ok());
    o.precision_map = *map;
    return o;
  };
  const auto want = ReferenceOutputs(model_dir, reqs, load(prefill_map), load(decode_map));
  // Each map matters: the reference without one of them differs somewhere.
  auto differs = [&](const std::vector<engine::GenerateResult>& other) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (other[i].ids != want[i].ids || other[i].logprobs != want[i].logprobs) return true;
    }
    return false;
  };
  REQUIRE(differs(ReferenceOutputs(model_dir, reqs, load(""), load(decode_map))));
  REQUIRE(differs(ReferenceOutputs(model_dir, reqs, load(prefill_map), load(""))));
  REQUIRE(differs(ReferenceOutputs(model_dir, reqs, {.precision_map = load(prefill_map).precision_map},
                                   {.precision_map = load(decode_map).precision_map})));

  const std::vector<ParsedCompletion> got = SendAll(c.http_port(), reqs, model);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string diff = Compare(got[i], want[i], reqs[i]);
    INFO("request " << i << " (prompt " << reqs[i].prompt.size() << " tokens, temperature " << reqs[i].temperature
                    << "): " << diff);
    REQUIRE(diff.empty());
  }
  nlohmann::json stats = WaitIdle(c);
  int64_t moved = 0, blocks = 0;
  for (auto& [id, w] : stats["workers"].items()) {
    if (w["role"] != "decode") continue;
    moved += w["kv_bytes_moved"].get<int64_t>();
    blocks += w["kv_blocks_transferred"].get<int64_t>();
  }
  INFO(stats.dump());
  REQUIRE(blocks > 0);
  REQUIRE(moved == blocks * kTinyBlockBytes / 2);
}

// Tensor parallelism across the disaggregation boundary: a TP=2 prefill
// (two ranks, each computing half the heads and writing them into its one
// pool in the unsharded layout) hands its KV to a TP=1 decode, which pulls
// it as from any prefill. The greedy tokens equal TP=1 everywhere (duet
// generate). TP sums o_proj and down in two halves, so the first token's
// logprob, which the prefill computes, differs from TP=1's in its last bits
// somewhere; a prefill that ignored --tp would match it exactly.
TEST_CASE("tensor parallelism across pools: a TP=2 prefill and a TP=1 decode serve TP=1's greedy tokens",
          "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "512", "--tp", "2"}, {"--kv-blocks", "512"}))
              .ok());
  auto reqs = MixedRequests(48, 1000, 100, 16, 23);
  for (TestRequest& r : reqs) {
    r.temperature = 0;
    r.logprobs = 2;
  }
  const auto want = ReferenceOutputs(model_dir, reqs);
  const std::vector<ParsedCompletion> got = SendAll(c.http_port(), reqs, model);
  Verdicts v;
  int first_differs = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string diff = Verify(model_dir, got[i], want[i], reqs[i], &v);
    INFO("request " << i << " (prompt " << reqs[i].prompt.size() << " tokens): " << diff);
    REQUIRE(diff.empty());
    REQUIRE(!got[i].token_logprobs.empty());
    first_differs += got[i].token_logprobs[0] != static_cast<double>(want[i].logprobs[0]) ? 1 : 0;
  }
  WARN(v.exact << " of " << reqs.size() << " outputs equal TP=1 token for token; " << v.near_tie
                << " took the other branch at a float near-tie; " << first_differs
                << " first-token logprobs differ from TP=1's in their last bits");
  REQUIRE(v.exact >= static_cast<int>(reqs.size() * 9 / 10));
  REQUIRE(first_differs > 0);
  WaitIdle(c);
}

// Prefill and decode must agree on the KV dtype: a decode worker refuses a
// handle of another dtype, and the request ends in an error that says so
// rather than in KV read at the wrong width. Nothing stays allocated.
TEST_CASE("a prefill pool and a decode pool of different KV dtypes: the request fails naming both dtypes",
          "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "64", "--kv-dtype", "bf16"},
                                           {"--kv-blocks", "64", "--kv-dtype", "f32"}))
              .ok());
  const nlohmann::json body = {{"model", model}, {"prompt", std::vector<int32_t>(40, 9)}, {"max_tokens", 4}};
  auto r = c.Post("/v1/completions", body.dump());
  REQUIRE(r.ok());
  INFO(r->body);
  CHECK(r->status == 500);  // The cluster's fault, not the client's.
  CHECK_THAT(r->body, Catch::Contains("dtype") && Catch::Contains("bf16") && Catch::Contains("f32"));
  WaitIdle(c);
}

TEST_CASE("the prefix cache, on by default: misses, partial hits and hits on device and on host give duet "
          "generate's outputs, disaggregated and colocated",
          "[serving]") {
  const bool colocated = GENERATE(false, true);
  INFO((colocated ? "colocated" : "disaggregated"));
  // Rounds of 8 requests of up to 7 blocks each (about 30 distinct full
  // blocks) on 16 device blocks for prefill (12 colocated, 1 request at a
  // time, so that none is preempted): the tree's nodes move to the 48-block
  // host tier (in GiB on the colocated worker, in blocks on the prefill)
  // and come back.
  const std::string host_gib = absl::StrCat(48.0 * kTinyBlockBytes / (1 << 30));
  const std::string worker = colocated ? "colocated-0" : "prefill-0";
  std::vector<Cluster::Worker> workers = {{"prefill", worker, {"--kv-blocks", "16", "--kv-host-blocks", "48"}},
                                          {"decode", "decode-0", {"--kv-blocks", "1024"}}};
  if (colocated) {
    workers = {{"colocated", worker, {"--kv-blocks", "12", "--max-running", "1", "--kv-host-memory", host_gib}}};
  }
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, workers).ok());
  // A shared system prompt, one of four documents, a question: repeated
  // prompts hit whole, others share the system prompt or a document.
  std::mt19937 rng(5);
  std::vector<int32_t> system;
  for (int i = 0; i < 40; ++i) system.push_back(static_cast<int32_t>(3 + rng() % 900));
  std::vector<std::vector<int32_t>> docs(4);
  for (auto& d : docs) {
    for (int i = 0; i < 40 + static_cast<int>(rng() % 20); ++i) d.push_back(static_cast<int32_t>(3 + rng() % 900));
  }
  std::vector<TestRequest> round;
  for (int i = 0; i < 8; ++i) {
    TestRequest r;
    r.prompt = system;
    const auto& d = docs[static_cast<size_t>(i) % docs.size()];
    r.prompt.insert(r.prompt.end(), d.begin(), d.end());
    for (int q = 0; q < 4 + i % 3; ++q) r.prompt.push_back(static_cast<int32_t>(3 + rng() % 900));
    r.max_tokens = 6;
    r.logprobs = 5;
    r.stream = i % 2 == 1;
    round.push_back(r);
  }
  for (int k = 0; k < 3; ++k) RunAndCheck(c, round, model);  // misses, then hits
  const double query = MetricValue(c.ready(worker)["metrics_port"].get<int>(), "duet_prefix_cache_query_tokens_total", "tier=\"device\"");
  const double device = MetricValue(c.ready(worker)["metrics_port"].get<int>(), "duet_prefix_cache_hit_tokens_total", "tier=\"device\"");
  const double host = MetricValue(c.ready(worker)["metrics_port"].get<int>(), "duet_prefix_cache_hit_tokens_total", "tier=\"host\"");
  INFO("query " << query << ", device hits " << device << ", host hits " << host);
  int64_t prompt_tokens = 0;
  for (const auto& r : round) prompt_tokens += static_cast<int64_t>(r.prompt.size());
  CHECK(query == 3 * prompt_tokens);
  CHECK(device > 0);
  CHECK(host > 0);
  // Usage reports what the cache supplied: a repeated 100-token prompt
  // finds its 6 full blocks of 16 (the last, partial block is recomputed).
  std::vector<int32_t> hundred;
  for (int i = 0; i < 100; ++i) hundred.push_back(static_cast<int32_t>(901 + i % 90));
  const std::string body =
      nlohmann::json{{"model", model}, {"prompt", hundred}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  int64_t cached[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    auto r = c.Post("/v1/completions", body);
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    cached[k] = nlohmann::json::parse(r->body)["usage"]["prompt_tokens_details"]["cached_tokens"];
  }
  CHECK(cached[0] == 0);
  CHECK(cached[1] == 96);
  // Reset (vLLM's endpoint): the same prompt is computed whole again.
  auto reset = c.Post("/reset_prefix_cache", "");
  REQUIRE(reset.ok());
  CHECK(reset->status == 200);
  CHECK(nlohmann::json::parse(reset->body)["reset_workers"] == 1);
  auto again = c.Post("/v1/completions", body);
  REQUIRE(again.ok());
  CHECK(nlohmann::json::parse(again->body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  // What the cache found was not computed again.
  auto stats = c.Stats();
  REQUIRE(stats.ok());
  const nlohmann::json& w = (*stats)["workers"][worker];
  REQUIRE(w.value("preemptions", 0) == 0);
  CHECK(w["prompt_tokens_computed"].get<double>() == 3 * prompt_tokens - device - host + 100 + (100 - 96) + 100);
}

TEST_CASE("chat documents: a document's KV is found again under the same system prompt and preceding documents",
          "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "256"}, {"--kv-blocks", "256"})).ok());
  const std::vector<text::ChatMessage> messages = {{"system", "Answer from the documents."},
                                                     {"user", "Which document speaks of decode?"}};
  const std::vector<text::ChatDocument> a = {{"a", "", "Prefill runs the whole prompt through the model once."}},
                                          b = {{"b", "", "Decode adds one token a step to every running request."}},
                                          d = {{"d", "", "The knowledge tree keeps the KV of retrieved documents."}};
  auto docs_json = [](const std::vector<text::ChatDocument>& docs) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& doc : docs) j.push_back({{"id", doc.id}, {"text", doc.text}});
    return j;
  };
  auto cached = [&](const std::vector<text::ChatDocument>& docs) {
    nlohmann::json body = {{"model", model},
                           {"messages", {{{"role", "system"}, {"content", messages[0].content}},
                                         {{"role", "user"}, {"content", messages[1].content}}}},
                           {"documents", docs_json(docs)},
                           {"max_tokens", 3},
                           {"temperature", 0}};
    auto r = c.Post("/v1/chat/completions", body.dump());
    REQUIRE(r.ok());
    INFO(r->body);
    REQUIRE(r->status == 200);
    return nlohmann::json::parse(r->body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  // What each request can find, from the same rendering: the full blocks of
  // the tokens it shares with what came before.
  auto format = text::PromptFormat::Load(model_dir);
  auto tok = text::Tokenizer::Load(model_dir);
  REQUIRE(format.ok());
  REQUIRE(tok.ok());
  auto ids = [&](const std::vector<text::ChatDocument>& docs) {
    return (*tok)->Encode(format->RenderChat(messages, true, docs).value()).value();
  };
  auto shared_blocks = [](const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
    size_t n = 0;
    while (n < x.size() && n < y.size() && x[n] == y[n]) ++n;
    n = std::min(n, std::min(x.size(), y.size()) - 1);  // the last token is always computed
    return static_cast<int64_t>(n / 16 * 16);
  };
  auto concat = [](std::vector<text::ChatDocument> x, const std::vector<text::ChatDocument>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  const auto ab = concat(a, b), ad = concat(a, d), ba = concat(b, a);
  CHECK(cached(ab) == 0);
  const int64_t same_first = cached(ad);
  CHECK(same_first == shared_blocks(ids(ab), ids(ad)));
  const int64_t other_order = cached(ba);
  CHECK(other_order == std::max(shared_blocks(ids(ba), ids(ab)), shared_blocks(ids(ba), ids(ad))));
  // The first document is found again after the system prompt; in the other
  // order only the system prompt is.
  CHECK(same_first > other_order);
  CHECK(cached(ab) == shared_blocks(ids(ab), ids(ab)));
}

TEST_CASE("a decode pool too small for the load preempts, and outputs stay the same", "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  // 24 decode blocks = 384 positions for a dozen requests of up to ~110 positions each.
  REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "1024"}, {"--kv-blocks", "24"})).ok());
  auto reqs = MixedRequests(24, 1000, 60, 48, 7);
  for (auto& r : reqs) r.max_tokens = std::max(r.max_tokens, 40);
  RunAndCheck(c, reqs, model);
  nlohmann::json stats = WaitIdle(c);
  INFO(stats.dump());
  REQUIRE(stats["workers"]["decode-0"]["preemptions"].get<int64_t>() > 0);
}

// Each request alone, one after another.
std::vector<ParsedCompletion> SendInTurn(Cluster& c, const std::vector<TestRequest>& reqs, const std::string& model) {
  std::vector<ParsedCompletion> got;
  for (const TestRequest& r : reqs) {
    auto res = c.Post("/v1/completions", CompletionBody(r, model));
    REQUIRE(res.ok());
    REQUIRE(res->status == 200);
    got.push_back(ParseCompletion(res->body, r.stream));
  }
  return got;
}

TEST_CASE("reproducible sampling: a seeded request gets the same text alone and among 64 others, with the prefix "
          "cache on, disaggregated and colocated",
          "[serving]") {
  const bool colocated = GENERATE(false, true);
  INFO((colocated ? "colocated" : "disaggregated"));
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.StartRouter(model_dir).ok());
  const std::vector<std::string> roles =
      colocated ? std::vector<std::string>{"colocated", "colocated"}
                : std::vector<std::string>{"prefill", "prefill", "decode", "decode"};
  std::vector<cluster::WorkerSpec> specs;
  for (const std::string& role : roles) specs.push_back({.role = role, .args = {"--kv-blocks", "2048"}});
  REQUIRE(c.StartWorkers(specs).ok());
  std::mt19937 rng(71);
  auto prompt = [&](int lo, int hi) {
    std::vector<int32_t> p(std::uniform_int_distribution<int>(lo, hi)(rng));
    for (auto& t : p) t = std::uniform_int_distribution<int32_t>(1, 999)(rng);
    return p;
  };
  std::vector<TestRequest> sampled, greedy, others;
  for (int i = 0; i < 64; ++i) {
    sampled.push_back({.prompt = prompt(20, 300), .max_tokens = 64, .temperature = 1.0f, .seed = 1000u + i});
    greedy.push_back(sampled.back());
    greedy.back().temperature = 0;
    // Other lengths, some streamed, some sampled.
    others.push_back({.prompt = prompt(1, 400), .max_tokens = 8 + i % 50, .temperature = i % 2 ? 0.7f : 0.0f,
                      .seed = 7u * i, .stream = i % 3 == 0});
  }
  const std::vector<ParsedCompletion> alone = SendInTurn(c, sampled, model);
  // All 64 again, among the 64 others, at once; their prompts are cached now.
  std::vector<TestRequest> mixed = others;
  mixed.insert(mixed.begin() + 32, sampled.begin(), sampled.end());
  const std::vector<ParsedCompletion> together = SendAll(c.http_port(), mixed, model);
  const std::vector<ParsedCompletion> greedy_text = SendInTurn(c, greedy, model);
  int differ_from_greedy = 0;
  for (size_t i = 0; i < sampled.size(); ++i) {
    INFO("request " << i << " (prompt " << sampled[i].prompt.size() << " tokens): " << together[32 + i].error);
    REQUIRE(alone[i].ids.size() == 64);
    CHECK(together[32 + i].ids == alone[i].ids);
    differ_from_greedy += alone[i].ids != greedy_text[i].ids;
  }
  CHECK(differ_from_greedy > 0);
  // The second round found its prompts cached, and the text did not change.
  int64_t cached_total = 0;
  for (size_t i = 0; i < sampled.size(); ++i) cached_total += together[32 + i].cached_tokens;
  CHECK(cached_total > 0);
  WaitIdle(c);
}

TEST_CASE("colocated workers pass the same correctness test", "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, {{"colocated", "colocated-0", {"--kv-blocks", "1024"}},
                              {"colocated", "colocated-1", {"--kv-blocks", "1024"}}})
              .ok());
  RunAndCheck(c, MixedRequests(200, 1000, 120, 24, 43), model);
  CheckContextLimit(c, model);
  WaitIdle(c);
}

TEST_CASE("n choices: the prompt is prefilled once and shared; each choice equals duet generate with its index",
          "[serving]") {
  Cluster c;
  const std::string model_dir = TinyModelDir("llama"), model = ModelName(model_dir);
  REQUIRE(c.Start(model_dir, PrefillDecode({"--kv-blocks", "512"}, {"--kv-blocks", "512"})).ok());
  constexpr int kN = 4;
  // Prompts of whole blocks and of a partial last block; streamed and not.
  const std::vector<int> lengths = {16, 21, 37, 5};
  std::vector<TestRequest> refs;
  int64_t prompt_tokens = 0;
  for (size_t k = 0; k < lengths.size(); ++k) {
    TestRequest base;
    for (int i = 0; i < lengths[k]; ++i) base.prompt.push_back(3 + (i * 7 + static_cast<int>(k) * 13) % 900);
    base.max_tokens = 10;
    base.temperature = 1.0f;
    base.seed = 1000 + k;
    base.stream = k % 2 == 1;
    prompt_tokens += lengths[k];
    nlohmann::json body = nlohmann::json::parse(CompletionBody(base, model));
    body["n"] = kN;
    auto r = c.Post("/v1/completions", body.dump());
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    std::set<std::vector<int32_t>> distinct;
    for (int i = 0; i < kN; ++i) {
      TestRequest want = base;
      want.choice = static_cast<uint64_t>(i);
      ParsedCompletion got = ParseCompletion(r->body, base.stream, i);
      INFO("prompt " << k << " choice " << i);
      REQUIRE(got.error.empty());
      REQUIRE(got.ids.size() == 10);
      Verdicts v;
      const auto ref = ReferenceOutputs(model_dir, {want});
      CHECK(Verify(model_dir, got, ref[0], want, &v) == "");
      distinct.insert(got.ids);
    }
    CHECK(distinct.size() > 1);  // the choices sample differently
  }
  nlohmann::json stats = WaitIdle(c);
  INFO(stats.dump());
  // Each prompt ran through the model once, not once per choice.
  CHECK(stats["workers"]["prefill-0"]["prompt_tokens_computed"] == prompt_tokens);
  CHECK(stats["workers"]["decode-0"]["prompt_tokens_computed"] == 0);
}

}  // namespace
}  // namespace duet::testing

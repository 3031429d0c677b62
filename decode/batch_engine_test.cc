// BatchEngine without sockets: admission, chunked prefill mixed with decode,
// preemption, cancel in every state, import failures. Every output is checked
// token for token against engine::Generate on the same tiny model.
#include "decode/batch_engine.h"
#include "grammar/constraint.h"
#include "text/tokenizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "decode/service_test_util.h"
#include "engine/generator.h"
#include "kernels/cpu/cpu_backend.h"
#include "engine/testing/tiny_model.h"
#include "kvcache/prefix_tree.h"
#include "worker/pool_block_store.h"

namespace duet::decode {
namespace {

engine::Model& TinyModel() { return SharedTinyModel("llama", /*threads=*/2); }

GenerationParams Greedy(int64_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

GenerationParams Seeded(int64_t max_tokens, uint64_t seed) {
  GenerationParams p;
  p.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = seed, .logprobs = 3};
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.choice_index = seed % 3;
  return p;
}

// The tiny model with another EOS id (same weights), to make EOS happen on cue.
engine::Model& TinyModelWithEos(int32_t eos) {
  static kernels::KernelBackendPtr backend = kernels::NewCpuBackend(2);
  static std::map<int32_t, std::unique_ptr<engine::Model>> models;
  auto& m = models[eos];
  if (m == nullptr) {
    namespace fs = std::filesystem;
    const std::string dir = testing::FreshDir("eos-" + std::to_string(eos));
    fs::copy(testing::TinyModelDir("llama"), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    std::ifstream in(dir + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    in.close();
    cfg["eos_token_id"] = eos;
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    auto loaded = engine::Model::Load(dir, backend.get());
    REQUIRE(loaded.ok());
    m = std::move(*loaded);
  }
  return *m;
}

engine::GenerateResult Reference(const std::vector<int32_t>& prompt, const GenerationParams& p,
                                 engine::Model& m = TinyModel()) {
  engine::BlockPool pool(m.KvLayoutFor(16), 80);
  engine::GenerateOptions o;
  o.max_tokens = p.max_tokens > 0 ? p.max_tokens : m.config().max_position_embeddings;
  o.sampling = p.sampling;
  o.ignore_eos = p.ignore_eos;
  o.stop_token_ids = p.stop_token_ids;
  o.choice_index = p.choice_index;
  auto r = engine::Generate(m, pool, prompt, o);
  REQUIRE(r.ok());
  return *r;
}

// Fills imported blocks by running the prompt through the model, as a
// prefill worker would, when the test says the "pull" is done.
class FakeImporter : public KvImporter {
 public:
  absl::Status Start(uint64_t id, absl::Span<const int32_t> blocks) override {
    started[id] = std::vector<int32_t>(blocks.begin(), blocks.end());
    return start_error;
  }
  std::optional<absl::Status> Poll(uint64_t id) override {
    if (auto f = fail.find(id); f != fail.end()) {
      absl::Status s = f->second;
      fail.erase(f);
      started.erase(id);
      return s;
    }
    if (!auto_complete && !ready.count(id)) return std::nullopt;
    const std::vector<int32_t>& kv = kv_tokens.at(id);
    engine::BatchSeq b{.tokens = kv, .start_pos = 0, .block_table = started.at(id)};
    REQUIRE(TinyModel().Forward({b}, *pool).ok());
    started.erase(id);
    ++completed;
    return absl::OkStatus();
  }
  void Abandon(uint64_t id) override { abandoned.insert(id); }

  engine::BlockPool* pool = nullptr;
  bool auto_complete = true;
  absl::Status start_error;
  std::map<uint64_t, std::vector<int32_t>> kv_tokens;  // Positions the "prefill" computed.
  std::map<uint64_t, std::vector<int32_t>> started;
  std::set<uint64_t> ready;
  std::map<uint64_t, absl::Status> fail;
  std::set<uint64_t> abandoned;
  int completed = 0;
};

struct Output {
  std::vector<engine::SampleResult> tokens;
  std::vector<bool> first;
  std::optional<FinishOut> finish;
  int64_t cached_tokens = -1;  // Reported with the first token.
};

BatchEngineOptions WithCache(BatchEngineOptions o, kvcache::PrefixTree* tree) {
  o.cache = tree;
  return o;
}

struct Harness {
  // cache_host_blocks >= 0: a prefix cache over the pool, with that many host blocks.
  explicit Harness(int64_t blocks, BatchEngineOptions options = {}, engine::Model* m = &TinyModel(),
                   int64_t cache_host_blocks = -1)
      : model(m),
        pool(m->KvLayoutFor(16), blocks),
        store(cache_host_blocks >= 0 ? std::make_unique<worker::PoolBlockStore>(&pool, cache_host_blocks) : nullptr),
        tree(store ? std::make_unique<kvcache::PrefixTree>(
                         kvcache::TreeOptions{.block_size = 16, .host_tier = cache_host_blocks > 0}, store.get())
                   : nullptr),
        engine(m, &pool, &importer, WithCache(options, tree.get())) {
    importer.pool = &pool;
  }

  void AddLocal(uint64_t id, std::vector<int32_t> prompt, GenerationParams p) {
    prompts[id] = prompt;
    params[id] = p;
    REQUIRE(engine.Add({.request_id = id, .prompt = std::move(prompt), .params = p}).ok());
  }
  // As decode gets it: token 1 sampled elsewhere, the prompt's KV to import.
  void AddImported(uint64_t id, std::vector<int32_t> prompt, GenerationParams p) {
    prompts[id] = prompt;
    params[id] = p;
    imported.insert(id);
    importer.kv_tokens[id] = prompt;
    const int32_t token1 = Reference(prompt, p).ids.at(0);
    REQUIRE(engine.Add({.request_id = id, .prompt = std::move(prompt), .params = p,
                        .generated = {token1}, .import_kv = true})
                .ok());
  }

  StepResult Step() {
    StepResult r = engine.Step();
    max_batch_tokens = std::max(max_batch_tokens, r.batch_tokens);
    for (const TokenOut& t : r.tokens) {
      REQUIRE(!out[t.request_id].finish.has_value());
      out[t.request_id].tokens.push_back(t.sample);
      out[t.request_id].first.push_back(t.first);
      if (t.first) out[t.request_id].cached_tokens = t.cached_tokens;
    }
    for (const FinishOut& f : r.finishes) {
      REQUIRE(!out[f.request_id].finish.has_value());
      out[f.request_id].finish = f;
    }
    return r;
  }
  void RunToEnd() {
    for (int i = 0; i < 20000 && engine.HasWork(); ++i) Step();
    REQUIRE(!engine.HasWork());
  }

  // Every request's tokens equal engine::Generate's; imported ones start
  // after token 1, which their "prefill" produced.
  void CheckAgainstGenerate() {
    for (const auto& [id, prompt] : prompts) {
      INFO("request " << id);
      const engine::GenerateResult ref = Reference(prompt, params[id], *model);
      const Output& o = out[id];
      REQUIRE(o.finish.has_value());
      REQUIRE(o.finish->kind == (ref.finish_reason == "stop" ? FinishKind::kStop : FinishKind::kLength));
      const size_t skip = imported.count(id) ? 1 : 0;
      REQUIRE(o.tokens.size() + skip == ref.ids.size());
      for (size_t i = 0; i < o.tokens.size(); ++i) {
        INFO("token " << i);
        REQUIRE(o.tokens[i].token == ref.ids[i + skip]);
        REQUIRE(std::abs(o.tokens[i].logprob - ref.logprobs[i + skip]) < 1e-4);
        REQUIRE(o.tokens[i].top_logprobs.size() == ref.top_logprobs[i + skip].size());
        for (size_t k = 0; k < o.tokens[i].top_logprobs.size(); ++k) {
          REQUIRE(o.tokens[i].top_logprobs[k].first == ref.top_logprobs[i + skip][k].first);
          REQUIRE(std::abs(o.tokens[i].top_logprobs[k].second - ref.top_logprobs[i + skip][k].second) < 1e-4);
        }
        // Only a locally prefilled request's first token is its TTFT token.
        REQUIRE(o.first[i] == (i == 0 && skip == 0));
      }
    }
  }

  engine::Model* model;
  engine::BlockPool pool;
  FakeImporter importer;
  std::unique_ptr<worker::PoolBlockStore> store;
  std::unique_ptr<kvcache::PrefixTree> tree;  // Outlives the engine, whose requests pin it.
  BatchEngine engine;
  std::map<uint64_t, std::vector<int32_t>> prompts;
  std::map<uint64_t, GenerationParams> params;
  std::set<uint64_t> imported;
  std::map<uint64_t, Output> out;
  int64_t max_batch_tokens = 0;
};

TEST_CASE("batched, chunked requests equal Generate token for token", "[batch_engine]") {
  Harness h(256, {.max_running = 256, .token_budget = 13});
  const int lens[] = {5, 20, 37, 3, 50, 16};
  for (int i = 0; i < 6; ++i) {
    GenerationParams p = i % 2 ? Seeded(10 + i, 100 + i) : Greedy(12 + i);
    if (i == 3) p.ignore_eos = false;
    h.AddLocal(i + 1, TestPrompt(lens[i], i), p);
  }
  h.AddImported(7, TestPrompt(33, 7), Seeded(14, 7));
  h.AddImported(8, TestPrompt(16, 8), Greedy(9));
  h.RunToEnd();
  h.CheckAgainstGenerate();
  REQUIRE(h.max_batch_tokens <= 13);  // The budget holds, decodes included.
  EngineCounts c = h.engine.counts();
  REQUIRE(c.preemptions == 0);
  REQUIRE(c.prompt_tokens_computed == 5 + 20 + 37 + 3 + 50 + 16);  // Local prompts only.
  REQUIRE(h.importer.completed == 2);
  REQUIRE(h.pool.num_free() == h.pool.num_blocks());
}

TEST_CASE("with a prefix cache: repeats, shared prefixes, a chat's next turn and host hits equal Generate",
          "[batch_engine]") {
  // 40 device blocks, 64 on host; at most two requests at a time.
  Harness h(40, {.max_running = 2, .token_budget = 64}, &TinyModel(), 64);
  auto greedy = [](int64_t n) {
    GenerationParams p = Greedy(n);
    p.sampling.logprobs = 5;
    return p;
  };
  auto concat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<int32_t> system = TestPrompt(40, 90);
  const std::vector<int32_t> first = concat(system, TestPrompt(30, 91));  // 70 tokens: 4 full blocks
  const std::vector<int32_t> third = concat(system, TestPrompt(30, 92));
  h.AddLocal(1, first, greedy(12));
  h.RunToEnd();
  CHECK(h.out[1].cached_tokens == 0);  // a miss
  h.AddLocal(2, first, Seeded(8, 3));  // the same prompt: all its full blocks
  h.AddLocal(3, third, greedy(6));  // the system prompt's 2 full blocks
  h.RunToEnd();
  CHECK(h.out[2].cached_tokens == 64);
  CHECK(h.out[3].cached_tokens == 32);
  // The next turn of request 1's chat: its prompt, its answer, a new question.
  std::vector<int32_t> answer;
  for (const engine::SampleResult& t : h.out[1].tokens) answer.push_back(t.token);
  h.AddLocal(4, concat(concat(first, answer), TestPrompt(20, 93)), greedy(5));
  h.RunToEnd();
  // Request 1's KV covered prompt and answer but the last token: 81 positions, 5 full blocks.
  CHECK(h.out[4].cached_tokens == 80);
  // Six unrelated 100-token prompts push the blocks used once (request 3's
  // own) to host; the ones used often (the system prompt's) stay.
  for (int i = 0; i < 6; ++i) h.AddLocal(10 + i, TestPrompt(100, 100 + i), greedy(4));
  h.RunToEnd();
  const EngineCounts before = h.engine.counts();
  h.AddLocal(5, third, greedy(7));
  h.RunToEnd();
  const EngineCounts after = h.engine.counts();
  CHECK(h.out[5].cached_tokens == 64);
  CHECK(after.cache_hit_tokens[static_cast<int>(kvcache::Tier::kHost)] -
            before.cache_hit_tokens[static_cast<int>(kvcache::Tier::kHost)] > 0);
  h.CheckAgainstGenerate();
  // The cache gave way before any request did, and no pin outlived its request.
  CHECK(after.preemptions == 0);
  CHECK(h.tree->CheckInvariants().empty());
  for (const kvcache::PrefixTree::Entry& e : h.tree->Entries()) CHECK(e.pins == 0);
  int64_t prompts = 0;
  for (const auto& [id, p] : h.prompts) prompts += static_cast<int64_t>(p.size());
  CHECK(after.cache_query_tokens == prompts);
  CHECK(after.prompt_tokens_computed == prompts - after.cache_hit_tokens[0] - after.cache_hit_tokens[1]);
  h.tree->Clear();
  CHECK(h.pool.num_free() == h.pool.num_blocks());
}

TEST_CASE("stop ids, min_tokens and the context's end finish as Generate does", "[batch_engine]") {
  SECTION("stop id and EOS") {
    const auto prompt = TestPrompt(12, 1);
    const auto free_run = Reference(prompt, Greedy(12));
    Harness h(64);
    GenerationParams p = Greedy(12);
    p.stop_token_ids = {free_run.ids[4]};
    h.AddLocal(1, prompt, p);
    GenerationParams q = Seeded(30, 5);
    q.ignore_eos = false;
    h.AddLocal(2, TestPrompt(9, 2), q);
    h.RunToEnd();
    h.CheckAgainstGenerate();
    REQUIRE(h.out[1].finish->kind == FinishKind::kStop);
    // The stop id may appear earlier than index 4; it ends at its first.
    REQUIRE(h.out[1].tokens.size() <= 5);
  }
  SECTION("min_tokens holds EOS back, not a stop id") {
    const auto prompt = TestPrompt(12, 1);
    const auto free_run = Reference(prompt, Greedy(12));
    // A model whose EOS is the first token greedy decoding produces.
    engine::Model& m = TinyModelWithEos(free_run.ids[0]);
    GenerationParams p = Greedy(12);
    p.ignore_eos = false;
    {
      Harness h(64, {}, &m);
      h.AddLocal(1, prompt, p);  // Ends at once, as Generate does.
      h.RunToEnd();
      h.CheckAgainstGenerate();
      REQUIRE(h.out[1].tokens.size() == 1);
      REQUIRE(h.out[1].finish->kind == FinishKind::kStop);
    }
    {
      Harness h(64, {}, &m);
      p.min_tokens = 3;
      h.AddLocal(1, prompt, p);
      GenerationParams q = p;
      q.stop_token_ids = {free_run.ids[0]};
      h.AddLocal(2, prompt, q);  // A stop id is not held back.
      h.RunToEnd();
      const Output& o = h.out[1];
      REQUIRE(o.tokens.size() >= 3);
      for (size_t i = 0; i < o.tokens.size(); ++i) REQUIRE(o.tokens[i].token == free_run.ids[i]);
      // It ends at the first EOS at or after min_tokens, or at max_tokens.
      for (size_t i = 2; i + 1 < o.tokens.size(); ++i) REQUIRE(o.tokens[i].token != free_run.ids[0]);
      REQUIRE(o.finish->kind == (o.tokens.back().token == free_run.ids[0] ? FinishKind::kStop : FinishKind::kLength));
      REQUIRE(h.out[2].tokens.size() == 1);
      REQUIRE(h.out[2].finish->kind == FinishKind::kStop);
    }
  }
  SECTION("the context's end is FINISH_LENGTH") {
    const int64_t context = TinyModel().config().max_position_embeddings;
    Harness h(80);
    h.AddLocal(1, TestPrompt(static_cast<int>(context) - 4, 3), Greedy(context));  // More than the context leaves.
    h.RunToEnd();
    h.CheckAgainstGenerate();
    REQUIRE(h.out[1].finish->kind == FinishKind::kLength);
    // Sampled at positions context-4 .. context-1: prompt + completion = context.
    REQUIRE(h.out[1].tokens.size() == 4);
  }
}

TEST_CASE("admission waits until the pool has the blocks", "[batch_engine]") {
  // A holds 7 of 8 blocks for its whole life (100 prompt + 10 generated
  // positions); B and C need 2 each and wait, in order, until A is done.
  Harness h(8);
  h.AddLocal(1, TestPrompt(100, 1), Greedy(10));
  h.AddImported(2, TestPrompt(30, 2), Seeded(6, 2));
  h.AddLocal(3, TestPrompt(20, 3), Greedy(4));
  h.Step();
  EngineCounts c = h.engine.counts();
  REQUIRE(c.running == 1);
  REQUIRE(c.waiting == 2);
  REQUIRE(h.pool.num_free() == 1);
  while (!h.out[1].finish.has_value()) {
    REQUIRE(h.importer.started.count(2) == 0);  // Not even a pull before it has room.
    REQUIRE(h.out[3].tokens.empty());
    h.Step();
  }
  h.RunToEnd();
  h.CheckAgainstGenerate();
  REQUIRE(h.engine.counts().preemptions == 0);
  REQUIRE(h.pool.num_free() == 8);
}

TEST_CASE("preemption under memory pressure keeps every output identical", "[batch_engine]") {
  for (int64_t budget : {2048, 16}) {
    INFO("token budget " << budget);
    // Four requests that grow to 4 blocks each share 10.
    Harness h(10, {.max_running = 256, .token_budget = budget});
    h.AddLocal(1, TestPrompt(20, 1), Greedy(40));
    h.AddImported(2, TestPrompt(18, 2), Seeded(40, 2));
    h.AddLocal(3, TestPrompt(22, 3), Seeded(40, 3));
    h.AddImported(4, TestPrompt(17, 4), Greedy(40));
    h.RunToEnd();
    h.CheckAgainstGenerate();
    EngineCounts c = h.engine.counts();
    REQUIRE(c.preemptions > 0);
    REQUIRE(c.prompt_tokens_computed > 20 + 22);  // Recomputes on top of the local prompts.
    REQUIRE(h.pool.num_free() == 10);
  }
}

TEST_CASE("a preempted request is requeued at the head of the queue", "[batch_engine]") {
  // A and B fill the pool; B (newest) is preempted when A needs a 4th block.
  // C, queued behind, would fit beside A but must not overtake B.
  Harness h(6);
  h.AddLocal(1, TestPrompt(47, 1), Greedy(20));  // 48 positions: 3 blocks, a 4th at token 2.
  h.AddLocal(2, TestPrompt(47, 2), Greedy(20));
  h.Step();
  h.AddLocal(3, TestPrompt(10, 3), Greedy(3));
  while (!h.out[1].finish.has_value()) {
    h.Step();
    REQUIRE(h.out[3].tokens.empty());
  }
  REQUIRE(h.engine.counts().preemptions == 1);
  h.RunToEnd();
  h.CheckAgainstGenerate();
  REQUIRE(h.pool.num_free() == 6);
}

TEST_CASE("cancel frees the blocks in every state and reports nothing", "[batch_engine]") {
  Harness h(16, {.max_running = 256, .token_budget = 8});
  h.importer.auto_complete = false;
  h.AddLocal(1, TestPrompt(20, 1), Greedy(50));     // running after its prefill
  h.AddLocal(2, TestPrompt(40, 2), Greedy(50));     // prefilling, 8 tokens a step
  h.AddImported(3, TestPrompt(20, 3), Greedy(50));  // pulling: never ready
  h.AddImported(4, TestPrompt(150, 4), Greedy(5));  // waiting: 10 blocks never free
  h.AddLocal(5, TestPrompt(20, 5), Greedy(50));     // waiting behind it
  for (int i = 0; i < 4; ++i) h.Step();
  EngineCounts c = h.engine.counts();
  REQUIRE(c.running == 1);
  REQUIRE(c.prefilling == 1);
  REQUIRE(c.pulling == 1);
  REQUIRE(c.waiting == 2);
  REQUIRE(!h.out[1].tokens.empty());
  const int64_t free_before = h.pool.num_free();

  REQUIRE(h.engine.Cancel(4));  // Waiting, imported: its prefill hears of it.
  REQUIRE(h.importer.abandoned.count(4) == 1);
  REQUIRE(h.engine.Cancel(5));  // Waiting, local.
  REQUIRE(h.pool.num_free() == free_before);
  REQUIRE(h.engine.Cancel(3));  // Pulling: the transfer is stopped, its blocks freed.
  REQUIRE(h.importer.abandoned.count(3) == 1);
  REQUIRE(h.pool.num_free() == free_before + 2);
  REQUIRE(h.engine.Cancel(2));  // Prefilling.
  REQUIRE(h.pool.num_free() == free_before + 2 + 3);
  REQUIRE(h.engine.counts().prefilling == 0);
  const size_t tokens_1 = h.out[1].tokens.size();
  REQUIRE(h.engine.Cancel(1));  // Running.
  REQUIRE(h.pool.num_free() == 16);
  REQUIRE(!h.engine.HasWork());
  REQUIRE(!h.engine.Cancel(1));
  h.Step();
  REQUIRE(h.out[1].tokens.size() == tokens_1);
  for (uint64_t id = 1; id <= 5; ++id) REQUIRE(!h.out[id].finish.has_value());
  // Running requests (1) were pulled long ago: nothing to abandon.
  REQUIRE(h.importer.abandoned.count(1) == 0);

  // A request whose cancel came first is refused when it arrives.
  REQUIRE(!h.engine.Cancel(99));
  absl::Status late = h.engine.Add({.request_id = 99, .prompt = TestPrompt(5, 9), .params = Greedy(3)});
  REQUIRE(late.code() == absl::StatusCode::kCancelled);
  REQUIRE(h.engine.Add({.request_id = 6, .prompt = TestPrompt(5, 9), .params = Greedy(3)}).ok());
  REQUIRE(h.engine.Add({.request_id = 6, .prompt = TestPrompt(5, 9), .params = Greedy(3)}).code() ==
          absl::StatusCode::kAlreadyExists);
  h.engine.DropAll();
  REQUIRE(h.pool.num_free() == 16);
}

TEST_CASE("a failed import ends the request with the importer's error", "[batch_engine]") {
  Harness h(16);
  h.importer.fail[1] = absl::UnavailableError("KV pull failed: lease_expired: epoch moved");
  h.AddImported(1, TestPrompt(20, 1), Greedy(5));
  h.AddLocal(2, TestPrompt(10, 2), Greedy(5));
  h.RunToEnd();
  REQUIRE(h.out[1].tokens.empty());
  REQUIRE(h.out[1].finish->kind == FinishKind::kError);
  REQUIRE(h.out[1].finish->error.code() == absl::StatusCode::kUnavailable);
  REQUIRE(h.out[1].finish->error.message() == "KV pull failed: lease_expired: epoch moved");
  REQUIRE(h.out[2].finish->kind == FinishKind::kLength);
  REQUIRE(h.importer.abandoned.count(1) == 0);  // The importer ended it itself.
  REQUIRE(h.pool.num_free() == 16);

  SECTION("a Start that fails ends it too") {
    h.importer.start_error = absl::UnavailableError("KV pull failed: connect: refused");
    h.AddImported(3, TestPrompt(20, 3), Greedy(5));
    h.RunToEnd();
    REQUIRE(h.out[3].finish->error.message() == "KV pull failed: connect: refused");
    REQUIRE(h.pool.num_free() == 16);
  }
}

TEST_CASE("a request larger than the whole pool fails at once", "[batch_engine]") {
  Harness h(4);
  h.AddLocal(1, TestPrompt(64, 1), Greedy(3));  // 65 positions: 5 blocks.
  h.AddLocal(2, TestPrompt(10, 2), Greedy(3));
  h.RunToEnd();
  REQUIRE(h.out[1].finish->kind == FinishKind::kError);
  REQUIRE(h.out[1].finish->error.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(h.out[2].finish->kind == FinishKind::kLength);
  REQUIRE(h.pool.num_free() == 4);
}

TEST_CASE("max_running bounds the requests that hold blocks", "[batch_engine]") {
  Harness h(64, {.max_running = 2, .token_budget = 2048});
  for (uint64_t id = 1; id <= 4; ++id) h.AddLocal(id, TestPrompt(10, static_cast<int>(id)), Greedy(6));
  h.Step();
  EngineCounts c = h.engine.counts();
  REQUIRE(c.running + c.prefilling == 2);
  REQUIRE(c.waiting == 2);
  h.RunToEnd();
  h.CheckAgainstGenerate();
}

}  // namespace
}  // namespace duet::decode

namespace duet::decode {
namespace {

// The tiny model's vocabulary as the grammar engine walks it.
std::shared_ptr<const grammar::Vocabulary> TinyVocab() {
  static const auto v = [] {
    auto tok = text::Tokenizer::Load(testing::TinyModelDir("llama"));
    REQUIRE(tok.ok());
    auto vocab = grammar::Vocabulary::FromTokenizer(**tok, TinyModel().config().eos_token_ids);
    REQUIRE(vocab.ok());
    return *vocab;
  }();
  return v;
}

std::shared_ptr<grammar::TokenConstraint> Constraint(const grammar::ConstraintRequest& r) {
  auto g = grammar::CompileConstraint(r, TinyVocab());
  REQUIRE(g.ok());
  return std::make_shared<grammar::TokenConstraint>(*g, r.triggers);
}

std::string TextOf(const std::vector<engine::SampleResult>& tokens) {
  std::string s;
  for (const auto& t : tokens) s += TinyVocab()->bytes(t.token);
  return s;
}

TEST_CASE("grammars: masked rows beside free ones, the same alone, batched and preempted; a grammar that ends "
          "stops an ignore_eos row",
          "[batch_engine][grammar]") {
  const grammar::ConstraintRequest digits{.kind = grammar::ConstraintKind::kRegex, .text = "[0-9]{12}"};
  const grammar::ConstraintRequest choice{.kind = grammar::ConstraintKind::kChoice, .choices = {"yes", "no"}};
  auto constrained = [&](Harness& h, uint64_t id, const grammar::ConstraintRequest& r, bool ignore_eos) {
    GenerationParams p = Seeded(40, id);
    p.ignore_eos = ignore_eos;
    REQUIRE(h.engine.Add({.request_id = id, .prompt = TestPrompt(9 + static_cast<int>(id), 50 + id), .params = p,
                          .constraint = Constraint(r)})
                .ok());
  };
  // Alone.
  std::map<uint64_t, std::string> alone;
  for (uint64_t id : {101, 102}) {
    Harness h(64);
    constrained(h, id, id == 101 ? digits : choice, /*ignore_eos=*/id == 102);
    h.RunToEnd();
    REQUIRE(h.out[id].finish.has_value());
    CHECK(h.out[id].finish->kind == FinishKind::kStop);
    alone[id] = TextOf(h.out[id].tokens);
  }
  INFO("alone: " << alone[101] << " / " << alone[102]);
  CHECK(alone[101].size() == 12);
  CHECK(alone[101].find_first_not_of("0123456789") == std::string::npos);
  CHECK((alone[102] == "yes" || alone[102] == "no"));  // EOS is no text; ignore_eos did not run past it
  // Batched with free rows, on a pool small enough to preempt.
  for (int64_t blocks : {int64_t{256}, int64_t{12}}) {
    INFO(blocks << " blocks");
    Harness h(blocks, {.max_running = 256, .token_budget = 24});
    for (int i = 0; i < 4; ++i) h.AddLocal(i + 1, TestPrompt(20 + 7 * i, i), i % 2 ? Seeded(30, 200 + i) : Greedy(30));
    constrained(h, 101, digits, false);
    constrained(h, 102, choice, true);
    h.RunToEnd();
    h.CheckAgainstGenerate();
    for (uint64_t id : {101, 102}) {
      REQUIRE(h.out[id].finish.has_value());
      CHECK(h.out[id].finish->kind == FinishKind::kStop);
      CHECK(TextOf(h.out[id].tokens) == alone[id]);
    }
    if (blocks == 12) CHECK(h.engine.counts().preemptions > 0);
    CHECK(h.pool.num_free() == h.pool.num_blocks());
  }
}

}  // namespace
}  // namespace duet::decode

// The one finish rule, through each real entry point: a table of (params,
// tokens generated before, next token) is run by engine::Generate, by the
// prefill worker's first-token decision (the resumed tokens are the ones
// generated before) and by a decode batch step (the same tokens resumed),
// on a model whose next tokens the test forces; each must reach the table's
// decision, min_tokens included.
//
// The forced model is the tiny llama made to pick each token's successor
// (engine/testing/forced_model.h).
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "decode/batch_engine.h"
#include "engine/block_pool.h"
#include "spec/generation.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/testing/forced_model.h"
#include "engine/testing/tiny_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "prefill/request.h"
#include "spec/generation_spec.h"
#include "kernels/dtype.h"

namespace duet::testing {
namespace {
using spec::FinishDecision;

constexpr int32_t kFiller = 7;  // Prompt tokens before the chain's first.

struct Row {
  const char* what;
  spec::GenerationParams params;
  int64_t prompt_len;              // Including the chain's first token.
  std::vector<int32_t> generated;  // Before `next`.
  int32_t next;
  FinishDecision want;
};

// The tiny llama with the successor map `next` forced into it.
std::string ForcedModel(const std::map<int32_t, int32_t>& next) {
  absl::StatusOr<std::string> dir = WriteForcedModel(TinyModelDir("llama"), FreshDir("forced-llama"), next);
  REQUIRE(dir.ok());
  return *dir;
}

spec::GenerationParams Params(int64_t max_tokens, int64_t min_tokens = 0, bool ignore_eos = false,
                                std::vector<int32_t> stop = {}) {
  spec::GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  p.min_tokens = min_tokens;
  p.ignore_eos = ignore_eos;
  p.stop_token_ids = std::move(stop);
  return p;
}

std::vector<int32_t> Prompt(const Row& r, int32_t first) {
  std::vector<int32_t> p(r.prompt_len - 1, kFiller);
  p.push_back(first);
  return p;
}

proto::PrefillRequest AsPrefillRequest(const Row& r, const std::vector<int32_t>& prompt) {
  proto::PrefillRequest q;
  proto::GenerationSpec& s = *q.mutable_spec();
  for (int32_t id : prompt) s.add_prompt_ids(id);
  s.mutable_sampling()->set_top_p(1);
  s.set_max_tokens(static_cast<int32_t>(r.params.max_tokens));
  s.set_min_tokens(static_cast<int32_t>(r.params.min_tokens));
  s.set_ignore_eos(r.params.ignore_eos);
  for (int32_t id : r.params.stop_token_ids) s.add_stop_token_ids(id);
  for (int32_t id : r.generated) q.add_resume_ids(id);
  q.set_decode_address("127.0.0.1:9");  // Never reached: only the decision is asked.
  return q;
}

TEST_CASE("every entry point ends a request at the same token for the same reason", "[finish]") {
  auto backend = kernels::NewCpuBackend(1);
  auto base = engine::Model::Load(TinyModelDir("llama"), backend.get());
  REQUIRE(base.ok());
  const int64_t context = (*base)->config().max_position_embeddings;
  const int32_t eos = (*base)->config().eos_token_ids.at(0);
  // Fresh ordinary ids for each row's chain; `eos` and 900 may end many.
  int32_t fresh = 100;
  auto tok = [&] { return fresh++; };
  const int32_t stop = 900;
  std::vector<Row> rows;
  auto add = [&](const char* what, spec::GenerationParams p, int64_t prompt_len, int generated, int32_t next,
                 FinishDecision want) {
    Row r{what, std::move(p), prompt_len, {}, 0, want};
    for (int i = 0; i < generated; ++i) r.generated.push_back(tok());
    r.next = next == 0 ? tok() : next;
    rows.push_back(std::move(r));
  };
  add("an ordinary token continues", Params(8), 5, 0, 0, FinishDecision::kContinue);
  add("EOS stops", Params(8), 5, 0, eos, FinishDecision::kStop);
  add("EOS with ignore_eos continues", Params(8, 0, true), 5, 0, eos, FinishDecision::kContinue);
  add("EOS before min_tokens continues", Params(8, 3), 5, 1, eos, FinishDecision::kContinue);
  add("EOS at min_tokens stops", Params(8, 3), 5, 2, eos, FinishDecision::kStop);
  add("a stop id ends before min_tokens", Params(8, 3, false, {stop}), 5, 1, stop, FinishDecision::kStop);
  add("a stop id ends despite ignore_eos", Params(8, 0, true, {stop}), 5, 2, stop, FinishDecision::kStop);
  add("max_tokens reached is length", Params(3), 5, 2, 0, FinishDecision::kLength);
  add("a stop beats max_tokens", Params(3), 5, 2, eos, FinishDecision::kStop);
  add("one short of max_tokens continues", Params(3), 5, 1, 0, FinishDecision::kContinue);
  add("max_tokens 1 ends at the first token", Params(1), 5, 0, 0, FinishDecision::kLength);
  add("min_tokens = max_tokens: EOS at the last stops", Params(2, 2), 5, 1, eos, FinishDecision::kStop);
  // Sampled at position prompt + generated: at context - 1 it fills the context.
  add("a token at the context's last position is length", Params(100), context - 2, 1, 0, FinishDecision::kLength);
  add("one position earlier continues", Params(100), context - 3, 1, 0, FinishDecision::kContinue);

  // Each row's chain: first -> generated... -> next.
  std::map<int32_t, int32_t> successor;
  std::vector<int32_t> firsts;
  for (const Row& r : rows) {
    const int32_t first = tok();
    firsts.push_back(first);
    int32_t from = first;
    for (int32_t g : r.generated) {
      successor[from] = g;
      from = g;
    }
    successor[from] = r.next;
  }
  auto model = engine::Model::Load(ForcedModel(successor), backend.get());
  REQUIRE(model.ok());
  const int64_t blocks = (context + 1 + 15) / 16 + 1;

  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    INFO(r.what);
    const std::vector<int32_t> prompt = Prompt(r, firsts[i]);
    const size_t k = r.generated.size();

    // engine::Generate: the table's tokens come first; it goes on past `next` only on kContinue.
    engine::BlockPool gen_pool((*model)->KvLayoutFor(16), blocks);
    engine::GenerateOptions opt;
    static_cast<spec::GenerationParams&>(opt) = r.params;
    auto g = engine::Generate(**model, gen_pool, prompt, opt);
    REQUIRE(g.ok());
    REQUIRE(g->ids.size() >= k + 1);
    std::vector<int32_t> head(g->ids.begin(), g->ids.begin() + k + 1);
    std::vector<int32_t> want_head = r.generated;
    want_head.push_back(r.next);
    REQUIRE(head == want_head);
    const FinishDecision by_generate = g->ids.size() > k + 1     ? FinishDecision::kContinue
                                       : g->finish_reason == "stop" ? FinishDecision::kStop
                                                                    : FinishDecision::kLength;

    // The prefill worker: `generated` resumed, `next` its first token.
    const proto::PrefillRequest q = AsPrefillRequest(r, prompt);
    REQUIRE(prefill::ValidatePrefillRequest(q, (*model)->config()).ok());
    const FinishDecision by_prefill =
        prefill::DecideFirstTokenEnd(q, spec::ToGenerationParams(q.spec()), (*model)->config(), r.next);

    // A decode batch step over the same request, resumed, sampling `next`.
    engine::BlockPool pool((*model)->KvLayoutFor(16), blocks);
    decode::BatchEngine batch(model->get(), &pool, nullptr, {});
    REQUIRE(batch.Add({.request_id = 1, .prompt = prompt, .params = r.params, .generated = r.generated}).ok());
    FinishDecision by_decode = FinishDecision::kContinue;
    bool sampled = false;
    for (int step = 0; step < 8 && !sampled; ++step) {
      decode::StepResult s = batch.Step();
      for (const decode::TokenOut& t : s.tokens) {
        if (t.request_id != 1) continue;
        REQUIRE(t.sample.token == r.next);
        sampled = true;
      }
      for (const decode::FinishOut& f : s.finishes) {
        REQUIRE(f.kind != decode::FinishKind::kError);
        by_decode = f.kind == decode::FinishKind::kStop ? FinishDecision::kStop : FinishDecision::kLength;
      }
    }
    REQUIRE(sampled);
    batch.DropAll();

    CHECK(by_generate == r.want);
    CHECK(by_prefill == r.want);
    CHECK(by_decode == r.want);
  }
}

}  // namespace
}  // namespace duet::testing

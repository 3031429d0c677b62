// Seeded sampling gives the same tokens in one Generate call as in a
// prefill-only step followed by decode-only steps on the same KV (the
// disaggregated split), and in a batch beside another sequence.
#include <catch2/catch.hpp>
#include <vector>

#include "engine/block_pool.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu_backend.h"
#include "engine/testing/tiny_model.h"

namespace duet {
namespace {

using engine::BatchSeq;
using spec::SamplingParams;

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + 11) % 900;
  return p;
}

TEST_CASE("seeded sampling: one call equals prefill-only then decode-only", "[sampling]") {
  auto backend = kernels::NewCpuBackend(2);
  for (const char* arch : {"llama", "qwen2"}) {
    INFO("arch " << arch);
    auto model = engine::Model::Load(testing::TinyModelDir(arch), backend.get());
    REQUIRE(model.ok());
    auto& m = **model;
    engine::BlockPool pool(m.KvLayoutFor(16), 64);
    const auto prompt = Prompt(29);
    engine::GenerateOptions opt;
    opt.max_tokens = 24;
    opt.ignore_eos = true;
    opt.sampling = SamplingParams{.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .seed = 1234};
    auto one = engine::Generate(m, pool, prompt, opt);
    REQUIRE(one.ok());
    REQUIRE(one->ids.size() == 24);

    // Prefill-only: one step over the prompt, token 1 sampled from it.
    engine::SequenceKv seq(&pool);
    REQUIRE(seq.Reserve(prompt.size()).ok());
    BatchSeq pre{.tokens = prompt, .start_pos = 0, .block_table = seq.block_table(),
                 .logit_rows = {static_cast<int32_t>(prompt.size() - 1)}};
    auto logits = m.Forward({pre}, pool);
    REQUIRE(logits.ok());
    std::vector<int32_t> split;
    int64_t pos = static_cast<int64_t>(prompt.size());
    split.push_back(engine::Sample(logits->row(0), m.config().vocab_size, opt.sampling, 0, pos).token);

    // Decode-only, batched beside an unrelated sequence that changes the
    // batch's shape each step.
    engine::SequenceKv other(&pool);
    std::vector<int32_t> other_tokens = Prompt(7);
    REQUIRE(other.Reserve(64).ok());
    BatchSeq other_pre{.tokens = other_tokens, .start_pos = 0, .block_table = other.block_table()};
    REQUIRE(m.Forward({other_pre}, pool).ok());
    while (split.size() < 24) {
      REQUIRE(seq.Reserve(pos + 1).ok());
      const int32_t tok = split.back();
      std::vector<BatchSeq> batch;
      BatchSeq o{.tokens = absl::MakeConstSpan(&other_tokens[split.size() % 7], 1),
                 .start_pos = static_cast<int64_t>(7 + split.size()), .block_table = other.block_table(),
                 .logit_rows = {0}};
      BatchSeq d{.tokens = absl::MakeConstSpan(&tok, 1), .start_pos = pos, .block_table = seq.block_table(),
                 .logit_rows = {0}};
      if (split.size() % 2) batch = {o, d}; else batch = {d, o};
      auto out = m.Forward(batch, pool);
      REQUIRE(out.ok());
      ++pos;
      const int row = split.size() % 2 ? 1 : 0;
      split.push_back(engine::Sample(out->row(row), m.config().vocab_size, opt.sampling, 0, pos).token);
    }
    REQUIRE(split == one->ids);

    // And the seed matters: another seed gives another sequence.
    opt.sampling.seed = 4321;
    auto other_seed = engine::Generate(m, pool, prompt, opt);
    REQUIRE(other_seed.ok());
    REQUIRE(other_seed->ids != one->ids);
  }
}

TEST_CASE("greedy generation stops at EOS unless ignore_eos", "[sampling]") {
  auto backend = kernels::NewCpuBackend(2);
  auto model = engine::Model::Load(testing::TinyModelDir("llama"), backend.get());
  REQUIRE(model.ok());
  auto& m = **model;
  engine::BlockPool pool(m.KvLayoutFor(16), 64);
  engine::GenerateOptions opt;
  opt.max_tokens = 12;
  opt.sampling.temperature = 0;
  auto free_run = engine::Generate(m, pool, Prompt(10), opt);
  REQUIRE(free_run.ok());
  REQUIRE(free_run->finish_reason == "length");
  // Declare the third generated token a stop id: generation ends there.
  opt.stop_token_ids = {free_run->ids[2]};
  auto stopped = engine::Generate(m, pool, Prompt(10), opt);
  REQUIRE(stopped.ok());
  REQUIRE(stopped->finish_reason == "stop");
  const auto first = std::find(free_run->ids.begin(), free_run->ids.end(), free_run->ids[2]);
  REQUIRE(stopped->ids == std::vector<int32_t>(free_run->ids.begin(), first + 1));
  REQUIRE(pool.num_free() == pool.num_blocks());
}

}  // namespace
}  // namespace duet

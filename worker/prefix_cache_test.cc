// PrefixCache over the tiny model's pool: PGDSF's cost from a latency
// profile (the fit's prefill time of prefix + run less that of the prefix)
// or from FLOPs; a bad profile refused by name; blocks only the tree holds
// counted as available; reset; the metrics with the cache off.
#include "worker/prefix_cache.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/metrics.h"
#include "engine/block_pool.h"
#include "spec/model_config.h"
#include "engine/testing/tiny_model.h"

namespace duet::worker {
namespace {

struct Fixture {
  std::string dir = testing::TinyModelDir("llama");
  spec::ModelConfig config = spec::ModelConfig::FromFile(dir + "/config.json").value();
  kernels::KvLayout layout{
      .num_layers = config.num_layers, .num_kv_heads = config.num_kv_heads, .block_size = 16, .head_dim = config.head_dim};
  engine::BlockPool pool{layout, 32};
};

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (seed * 131 + i * 7) % 500);
  return t;
}

TEST_CASE("PGDSF's cost from a latency profile is the fit's prefill time the run saves") {
  Fixture f;
  // A DistServe-format fit for this model: prefill a + b l + c l^2 ms.
  const double a = 5, b = 0.25, c = 0.001;
  const std::string name = std::filesystem::path(f.dir).filename().string();
  nlohmann::json fit;
  fit[name]["1"] = {{"prefill", {a, b, c}}, {"decoding_smallbs", {1, 0.001, 0.1}}, {"decoding_largebs", {1, 0.001, 0.1}}};
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/profile.json";
  std::ofstream(path) << fit.dump();
  auto cache = PrefixCache::Create({.cost_profile = path}, &f.pool, f.dir, f.config);
  REQUIRE(cache.ok());
  for (auto [p, n] : {std::pair<int64_t, int64_t>{0, 16}, {16, 16}, {64, 32}, {480, 16}}) {
    INFO("prefix " << p << ", tokens " << n);
    const double want_ms = b * n + c * (static_cast<double>((p + n) * (p + n)) - static_cast<double>(p * p));
    CHECK((*cache)->Cost(p, n) == Approx(want_ms / 1e3).epsilon(1e-9));
  }
  // The same run costs more after a longer prefix (attention over it).
  CHECK((*cache)->Cost(480, 16) > (*cache)->Cost(0, 16));

  // Without a profile: FLOPs, also growing with the prefix.
  auto flops = PrefixCache::Create({}, &f.pool, f.dir, f.config);
  REQUIRE(flops.ok());
  const double h = static_cast<double>(f.config.hidden_size), layers = static_cast<double>(f.config.num_layers);
  CHECK((*flops)->Cost(32, 16) == Approx(16 * layers * (24 * h * h + 4 * h * (32 + 8))));

  // A profile without this model, or a missing file: refused, naming the file.
  nlohmann::json other;
  other["someone/else"] = fit[name];
  std::ofstream(path) << other.dump();
  auto bad = PrefixCache::Create({.cost_profile = path}, &f.pool, f.dir, f.config);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find(path) != std::string::npos);
  CHECK(std::string(bad.status().message()).find(name) != std::string::npos);
  CHECK_FALSE(PrefixCache::Create({.cost_profile = path + ".missing"}, &f.pool, f.dir, f.config).ok());
  // Host tier or profile with the cache off: a contradiction, refused.
  CHECK_FALSE(PrefixCache::Create({.enabled = false, .host_blocks = 4}, &f.pool, f.dir, f.config).ok());
}

TEST_CASE("blocks only the tree holds are available; shared ones are not; reset drops them") {
  Fixture f;
  auto cache = PrefixCache::Create({.host_blocks = 8}, &f.pool, f.dir, f.config);
  REQUIRE(cache.ok());
  kvcache::PrefixTree* tree = (*cache)->tree();
  REQUIRE(tree != nullptr);
  const std::vector<int32_t> prompt = Tokens(70, 1);  // 4 full blocks and a partial one
  {
    engine::SequenceKv seq(&f.pool);
    REQUIRE(seq.Reserve(70).ok());
    tree->Insert(prompt, seq.block_table());
    CHECK((*cache)->device_blocks() == 4);
    // All five blocks are the sequence's; four are the tree's too.
    CHECK((*cache)->AvailableBlocks() == 32 - 5);
  }
  // The sequence is gone: its partial block is free, the four the tree keeps
  // are available though not free.
  CHECK(f.pool.num_free() == 32 - 4);
  CHECK((*cache)->AvailableBlocks() == 32);
  // A request sharing two of them: those two are not available.
  kvcache::Match m = tree->Acquire(absl::MakeConstSpan(prompt).subspan(0, 40));
  CHECK(m.tokens == 32);
  {
    engine::SequenceKv seq(&f.pool);
    auto blocks = tree->SwapIn(m);
    REQUIRE(blocks.ok());
    REQUIRE(seq.ShareBlocks(*blocks).ok());
    CHECK((*cache)->AvailableBlocks() == 32 - 2);
  }
  tree->Release(m);
  CHECK((*cache)->Reset() == 4);
  CHECK(f.pool.num_free() == 32);
  CHECK((*cache)->device_blocks() == 0);
}

TEST_CASE("with the cache off, every looked-up token is a miss in both tiers") {
  Fixture f;
  MetricsRegistry& m = MetricsRegistry::Default();
  Counter* query[2] = {m.GetCounter("duet_prefix_cache_query_tokens_total", "", {{"tier", "device"}}),
                       m.GetCounter("duet_prefix_cache_query_tokens_total", "", {{"tier", "host"}})};
  Counter* hits = m.GetCounter("duet_prefix_cache_hit_tokens_total", "", {{"tier", "device"}});
  const double q0 = query[0]->Value(), q1 = query[1]->Value(), h0 = hits->Value();
  auto cache = PrefixCache::Create({.enabled = false}, &f.pool, f.dir, f.config);
  REQUIRE(cache.ok());
  CHECK((*cache)->tree() == nullptr);
  (*cache)->Publish(100, 0, 0);
  (*cache)->Publish(250, 0, 0);
  CHECK(query[0]->Value() - q0 == 250);
  CHECK(query[1]->Value() - q1 == 250);
  CHECK(hits->Value() - h0 == 0);
  CHECK((*cache)->AvailableBlocks() == 32);
}

}  // namespace
}  // namespace duet::worker

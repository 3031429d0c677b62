// One admission call (kvcache::Admit), three callers: the prefill
// scheduler, the decode/colocated batch engine and the simulator's prefill
// instance, fed the same prompts one after another over trees of the same
// options, find the same cached prefix for every prompt and count the same
// hits by tier: with room for everything (the values derived by hand), and
// with a device pool too small for the prompts' blocks and a host tier
// (LRU: eviction follows use alone, so the three see the same order).
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "decode/batch_engine.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "engine/testing/tiny_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvcache/prefix_tree.h"
#include "kvtransfer/loopback/loopback_transport.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/sim.h"
#include "prefill/scheduler.h"
#include "worker/pool_block_store.h"

namespace duet::testing {
namespace {

constexpr int64_t kBlock = 16;

struct Seen {
  std::vector<int64_t> cached;  // per prompt
  int64_t query = 0, device = 0, host = 0;
};

kvcache::TreeOptions Tree(int64_t host_blocks) {
  return {.block_size = kBlock, .policy = kvcache::Policy::kLru, .host_tier = host_blocks > 0};
}

Seen ThroughPrefill(const std::vector<std::vector<int32_t>>& prompts, int64_t blocks, int64_t host_blocks) {
  engine::BlockPool pool(kernels::KvLayout{.num_layers = 1, .num_kv_heads = 1, .block_size = kBlock, .head_dim = 2},
                         blocks);
  kvtransfer::KvTransportPtr transport = kvtransfer::NewLoopbackTransport();
  const kvtransfer::RegionId region =
      transport->RegisterRegion(pool.region_base(), static_cast<uint64_t>(pool.bytes()), blocks).value();
  worker::PoolBlockStore store(&pool, host_blocks);
  kvcache::PrefixTree tree(Tree(host_blocks), &store);
  FakeClock clock;
  Seen out;
  {
    prefill::PrefillScheduler sched({.max_batch_tokens = 4096, .cache = &tree}, &pool, transport.get(), region, &clock);
    for (size_t i = 0; i < prompts.size(); ++i) {
      proto::PrefillRequest r;
      r.set_request_id(i + 1);
      for (int32_t t : prompts[i]) r.mutable_spec()->add_prompt_ids(t);
      REQUIRE(sched.Enqueue(r, {}).ok());
      prefill::Step s = sched.Schedule();
      REQUIRE(s.chunks.size() == 1);
      out.cached.push_back(s.chunks[0].start_pos);
      REQUIRE(sched.Complete(s) == std::vector<uint64_t>{i + 1});
      sched.Finish(i + 1);
    }
    out.query = sched.cache_query_tokens();
    out.device = sched.cache_hit_tokens(kvcache::Tier::kDevice);
    out.host = sched.cache_hit_tokens(kvcache::Tier::kHost);
  }
  tree.Clear();
  REQUIRE(transport->DeregisterRegion(region).ok());
  return out;
}

Seen ThroughBatchEngine(const std::vector<std::vector<int32_t>>& prompts, int64_t blocks, int64_t host_blocks) {
  static auto backend = kernels::NewCpuBackend(1);
  static auto model = engine::Model::Load(TinyModelDir("llama"), backend.get());
  REQUIRE(model.ok());
  engine::BlockPool pool((*model)->KvLayoutFor(kBlock), blocks);
  worker::PoolBlockStore store(&pool, host_blocks);
  kvcache::PrefixTree tree(Tree(host_blocks), &store);
  Seen out;
  {
    decode::BatchEngine engine(model->get(), &pool, nullptr, {.cache = &tree});
    for (size_t i = 0; i < prompts.size(); ++i) {
      spec::GenerationParams p;
      p.sampling.temperature = 0;
      p.max_tokens = 1;
      REQUIRE(engine.Add({.request_id = i + 1, .prompt = prompts[i], .params = p}).ok());
      int64_t cached = -1;
      for (int step = 0; step < 100 && engine.HasWork(); ++step) {
        for (const decode::TokenOut& t : engine.Step().tokens) {
          if (t.first) cached = t.cached_tokens;
        }
      }
      REQUIRE(!engine.HasWork());
      out.cached.push_back(cached);
    }
    const decode::EngineCounts c = engine.counts();
    out.query = c.cache_query_tokens;
    out.device = c.cache_hit_tokens[0];
    out.host = c.cache_hit_tokens[1];
  }
  tree.Clear();
  return out;
}

Seen ThroughSim(const std::vector<std::vector<int32_t>>& prompts, int64_t blocks, int64_t host_blocks) {
  const placement::ModelSpec m = placement::ModelPreset("opt-13b").value();
  auto lat = placement::LoadLatencyModel("placement/testdata/distserve-a100-80g.json", m);
  REQUIRE(lat.ok());
  placement::ClusterSpec c;
  c.instances = {{.role = placement::InstanceRole::kPrefill, .par = {.tp = 1, .pp = 1}}};
  c.cache = {.device_blocks = blocks, .host_blocks = host_blocks, .block_size = kBlock, .policy = kvcache::Policy::kLru};
  std::vector<placement::PromptTokens> tokens(prompts.size());
  std::vector<placement::SimRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tokens[i].tokens = prompts[i];
    // An hour apart: each prefill ends before the next arrives.
    reqs.push_back({.arrival = 3600.0 * static_cast<double>(i), .prompt = static_cast<int64_t>(prompts[i].size()),
                    .output = 1, .content = &tokens[i]});
  }
  const placement::SimResult r = placement::Simulate(c, m, **lat, reqs);
  Seen out;
  for (const auto& q : r.requests) out.cached.push_back(q.cached);
  out.query = r.cache.query_tokens;
  out.device = r.cache.hit_device;
  out.host = r.cache.hit_host;
  return out;
}

std::vector<int32_t> Run(int32_t from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}
std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("the prefill scheduler, the batch engine and the simulator admit alike", "[kvcache][admission]") {
  const std::vector<int32_t> a = Run(100, 40), x = Run(300, 10), y = Run(400, 20), b = Run(600, 33);
  const std::vector<std::vector<int32_t>> prompts = {Cat(a, x), Cat(a, x), Cat(a, y), b, Cat(a, y), b, Cat(a, x)};

  SECTION("room for every block") {
    // The second a+x reuses 3 of its blocks (the last token is computed);
    // a+y shares a's first 2 blocks; a second a+y finds its own 3; b's
    // 33 tokens leave 2 full blocks to reuse; a+x again finds its 3.
    const std::vector<int64_t> want = {0, 48, 32, 0, 48, 32, 48};
    const Seen p = ThroughPrefill(prompts, 256, 0);
    const Seen e = ThroughBatchEngine(prompts, 256, 0);
    const Seen s = ThroughSim(prompts, 256, 0);
    CHECK(p.cached == want);
    CHECK(e.cached == want);
    CHECK(s.cached == want);
    for (const Seen* v : {&p, &e, &s}) {
      CHECK(v->query == 50 + 50 + 60 + 33 + 60 + 33 + 50);
      CHECK(v->device == 48 + 32 + 48 + 32 + 48);
      CHECK(v->host == 0);
    }
  }

  SECTION("a small device pool and a host tier") {
    // 6 device blocks: each prompt needs 3 or 4, so b's admission evicts
    // a+x's last block to host (the least recently used), where the last
    // a+x finds it.
    const Seen p = ThroughPrefill(prompts, 6, 64);
    const Seen e = ThroughBatchEngine(prompts, 6, 64);
    const Seen s = ThroughSim(prompts, 6, 64);
    INFO("prefill host hits " << p.host << ", device " << p.device);
    CHECK(p.host > 0);
    CHECK(e.cached == p.cached);
    CHECK(s.cached == p.cached);
    CHECK(e.query == p.query);
    CHECK(s.query == p.query);
    CHECK(e.device == p.device);
    CHECK(s.device == p.device);
    CHECK(e.host == p.host);
    CHECK(s.host == p.host);
  }
}

}  // namespace
}  // namespace duet::testing

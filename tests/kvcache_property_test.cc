// The knowledge tree (kvcache/prefix_tree) against a brute-force model,
// over the engine's real BlockPool and the workers' PoolBlockStore: thousands of random requests (acquire,
// swap in, compute the rest, insert, finish), evictions from either tier,
// lookups and resets, checking after every operation that
//   - a lookup returns exactly the longest cached block-aligned prefix of
//     the sequences inserted and not since evicted,
//   - the pool's reference counts equal the tree's blocks plus the running
//     requests' (nothing leaks, nothing is freed under a user), and the
//     store's count of blocks only the tree holds is right,
//   - tier accounting adds up and each node has at most one host copy,
//   - nothing pinned is evicted and no parent goes before its children,
//   - swapped blocks carry the KV they were copied from (real copies).
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/block_pool.h"
#include "kvcache/block_hash.h"
#include "kvcache/prefix_tree.h"
#include "worker/pool_block_store.h"

namespace duet {
namespace {

using kvcache::Match;
using kvcache::PrefixTree;
using kvcache::Tier;

constexpr int64_t kBlock = 4;

// What a block's KV stands for: its chained hash, written into its first
// two floats (24 bits each, exact in a float), through the pool's copies.
std::vector<float> ReadFloats(const engine::BlockPool& pool, int32_t b) {
  std::vector<float> block(static_cast<size_t>(pool.block_bytes()) / sizeof(float));
  REQUIRE(pool.ReadBlock(b, block.data()).ok());
  return block;
}
void Stamp(engine::BlockPool& pool, int32_t b, uint64_t h) {
  std::vector<float> block = ReadFloats(pool, b);
  block[0] = static_cast<float>(h & 0xffffff);
  block[1] = static_cast<float>((h >> 24) & 0xffffff);
  REQUIRE(pool.WriteBlock(b, block.data()).ok());
}
bool Stamped(const engine::BlockPool& pool, int32_t b, uint64_t h) {
  const std::vector<float> block = ReadFloats(pool, b);
  return block[0] == static_cast<float>(h & 0xffffff) && block[1] == static_cast<float>((h >> 24) & 0xffffff);
}

struct Request {
  Match match;
  std::vector<int32_t> pinned;  // the tokens of its match
  std::vector<int32_t> blocks;  // the request's own references
};

// The sequences a run draws from: a system prompt, then documents in a
// random order, then a tail, so prefixes are shared at many depths.
std::vector<int32_t> RandomPrompt(std::mt19937& rng) {
  static const std::vector<std::vector<int32_t>> docs = {
      {1, 2, 3, 4, 5, 6, 7, 8},         {9, 10, 11, 12},           {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24},
      {25, 26, 27, 28, 29, 30, 31, 32}, {33, 34, 35, 36, 37, 38}, {39, 40, 41, 42}};
  std::vector<int32_t> p = {100, 101, 102, 103};  // the system prompt: one block
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    const auto& d = docs[rng() % docs.size()];
    p.insert(p.end(), d.begin(), d.end());
  }
  const int tail = static_cast<int>(rng() % 9);
  for (int i = 0; i < tail; ++i) p.push_back(static_cast<int32_t>(50 + rng() % 30));
  return p;
}

// Every cached block-prefix, as a key of its tokens.
std::set<std::vector<int32_t>> Cached(const std::vector<PrefixTree::Entry>& entries) {
  std::set<std::vector<int32_t>> out;
  for (const auto& e : entries) {
    for (int64_t end = static_cast<int64_t>(e.tokens.size()) - e.node_tokens + kBlock;
         end <= static_cast<int64_t>(e.tokens.size()); end += kBlock) {
      out.insert(std::vector<int32_t>(e.tokens.begin(), e.tokens.begin() + end));
    }
  }
  return out;
}

int64_t LongestCached(const std::set<std::vector<int32_t>>& model, const std::vector<int32_t>& q) {
  int64_t best = 0;
  for (int64_t end = kBlock; end <= static_cast<int64_t>(q.size()); end += kBlock) {
    if (!model.count(std::vector<int32_t>(q.begin(), q.begin() + end))) break;
    best = end;
  }
  return best;
}

void RunProperty(kvcache::Policy policy, bool host_tier, uint32_t seed) {
  const kernels::KvLayout layout{.num_layers = 1, .num_kv_heads = 1, .block_size = kBlock, .head_dim = 2};
  engine::BlockPool pool(layout, 40);
  worker::PoolBlockStore store(&pool, host_tier ? 24 : 0);  // the workers' store: real copies
  PrefixTree tree({.block_size = kBlock, .policy = policy, .host_tier = host_tier,
                   .cost = [](int64_t prefix, int64_t tokens) { return 1e-3 * tokens * (1 + prefix / 64.0); }},
                  &store);
  std::mt19937 rng(seed);
  std::set<std::vector<int32_t>> model;  // inserted and not since evicted
  std::vector<Request> running;
  int hits = 0, host_hits = 0, evictions = 0;

  auto check = [&](const std::string& op) {
    INFO("after " << op);
    REQUIRE(tree.CheckInvariants() == "");
    const auto entries = tree.Entries();
    // The tree holds exactly what the model says is cached.
    REQUIRE(Cached(entries) == model);
    // Reference counts: the tree's device blocks plus the running requests'.
    std::map<int32_t, int> refs;
    std::set<int32_t> host_slots;
    int64_t device_blocks = 0, host_blocks = 0;
    for (const auto& e : entries) {
      for (int32_t b : e.device) ++refs[b];
      for (int32_t s : e.host) REQUIRE(host_slots.insert(s).second);  // one host copy per block
      device_blocks += static_cast<int64_t>(e.device.size());
      host_blocks += static_cast<int64_t>(e.host.size());
    }
    for (const Request& r : running) {
      for (int32_t b : r.blocks) ++refs[b];
    }
    for (int32_t b = 0; b < pool.num_blocks(); ++b) REQUIRE(pool.RefCount(b) == refs[b]);
    // Blocks only the tree holds (what a worker reports as free for the taking).
    std::set<int32_t> tree_blocks;
    for (const auto& e : entries) tree_blocks.insert(e.device.begin(), e.device.end());
    std::set<int32_t> running_blocks;
    for (const Request& r : running) running_blocks.insert(r.blocks.begin(), r.blocks.end());
    int64_t cache_only = 0;
    for (int32_t b : tree_blocks) cache_only += running_blocks.count(b) == 0 ? 1 : 0;
    REQUIRE(store.CacheOnlyBlocks() == cache_only);
    REQUIRE(tree.blocks(Tier::kDevice) == device_blocks);
    REQUIRE(tree.blocks(Tier::kHost) == host_blocks);
    REQUIRE(store.host_used() == host_blocks);
  };
  // An eviction may only remove unpinned prefixes, children before parents.
  auto observe_eviction = [&](const std::set<std::vector<int32_t>>& before) {
    const std::set<std::vector<int32_t>> after = Cached(tree.Entries());
    for (const auto& p : after) REQUIRE(before.count(p));  // nothing appears
    for (const Request& r : running) {
      // Every pinned prefix stays.
      for (int64_t end = kBlock; end <= r.match.tokens; end += kBlock) {
        REQUIRE(after.count(std::vector<int32_t>(r.pinned.begin(), r.pinned.begin() + end)));
      }
    }
    for (const auto& p : after) {
      if (p.size() > static_cast<size_t>(kBlock)) {
        REQUIRE(after.count(std::vector<int32_t>(p.begin(), p.end() - kBlock)));  // parent before child
      }
    }
    model = after;
  };

  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 45) {
      // A request: acquire, swap in, compute the rest, insert.
      const std::vector<int32_t> prompt = RandomPrompt(rng);
      const std::vector<int32_t> looked(prompt.begin(), prompt.end() - 1);  // the last token is always computed
      const int64_t expect = LongestCached(model, looked);
      const auto before = Cached(tree.Entries());
      Request r;
      r.match = tree.Acquire(looked);
      r.pinned.assign(looked.begin(), looked.begin() + r.match.tokens);
      REQUIRE(r.match.tokens == expect);
      REQUIRE(r.match.device_tokens <= r.match.tokens);
      auto cached = tree.SwapIn(r.match);
      observe_eviction(before);
      if (!cached.ok()) {
        tree.Release(r.match);
        check("a swap-in that found no room");
        continue;
      }
      host_hits += r.match.device_tokens < r.match.tokens;
      hits += r.match.tokens > 0;
      REQUIRE(static_cast<int64_t>(cached->size()) == r.match.tokens / kBlock);
      const std::vector<uint64_t> hashes = kvcache::BlockHashes(prompt, kBlock);
      for (size_t i = 0; i < cached->size(); ++i) REQUIRE(Stamped(pool, (*cached)[i], hashes[i]));
      for (int32_t b : *cached) pool.Ref(b);  // the request shares the cached prefix
      r.blocks = *cached;
      const int64_t need = static_cast<int64_t>(hashes.size()) - static_cast<int64_t>(cached->size());
      auto fresh = pool.Allocate(need);
      if (!fresh.ok()) {
        const auto before_evict = Cached(tree.Entries());
        tree.Evict(Tier::kDevice, need);
        observe_eviction(before_evict);
        fresh = pool.Allocate(need);
      }
      if (!fresh.ok()) {
        for (int32_t b : r.blocks) pool.Unref(b);
        tree.Release(r.match);
        check("a request that found no room");
        continue;
      }
      for (size_t i = 0; i < fresh->size(); ++i) Stamp(pool, (*fresh)[i], hashes[cached->size() + i]);
      r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
      // Documents start nodes: the system prompt's end is one boundary.
      tree.Insert(prompt, r.blocks, {kBlock});
      for (size_t end = kBlock; end <= hashes.size() * kBlock; end += kBlock) {
        model.insert(std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(end)));
      }
      running.push_back(std::move(r));
      check("a request");
    } else if (op < 80 && !running.empty()) {
      // A request ends (and its lease with it).
      const size_t i = rng() % running.size();
      for (int32_t b : running[i].blocks) pool.Unref(b);
      tree.Release(running[i].match);
      running.erase(running.begin() + static_cast<long>(i));
      check("a request's end");
    } else if (op < 95) {
      const Tier t = (rng() % 2 == 0 || !host_tier) ? Tier::kDevice : Tier::kHost;
      const auto before = Cached(tree.Entries());
      evictions += tree.Evict(t, 1 + static_cast<int64_t>(rng() % 6)) > 0;
      observe_eviction(before);
      check(absl::StrCat("an eviction from ", kvcache::TierName(t)));
    } else if (op < 99) {
      const std::vector<int32_t> q = RandomPrompt(rng);
      REQUIRE(tree.Lookup(q).tokens == LongestCached(model, q));
      check("a lookup");
    } else {
      const auto before = Cached(tree.Entries());
      tree.Clear();
      observe_eviction(before);
      check("a reset");
    }
  }
  // The run exercised what it claims to.
  CHECK(hits > 100);
  CHECK(evictions > 50);
  if (host_tier) {
    CHECK(host_hits > 10);
    CHECK(tree.stats().swap_out_blocks > 0);
    CHECK(tree.stats().swap_in_blocks > 0);
  }
  // Everything ends: the requests, then the tree; every block is free again.
  for (const Request& r : running) {
    for (int32_t b : r.blocks) pool.Unref(b);
    tree.Release(r.match);
  }
  running.clear();
  tree.Clear();
  CHECK(tree.nodes() == 0);
  CHECK(pool.num_free() == pool.num_blocks());
  CHECK(store.host_used() == 0);
}

TEST_CASE("the knowledge tree matches a brute-force model under random operations", "[kvcache]") {
  for (kvcache::Policy policy :
       {kvcache::Policy::kPgdsf, kvcache::Policy::kLru, kvcache::Policy::kLfu, kvcache::Policy::kGdsf}) {
    for (bool host : {true, false}) {
      INFO(kvcache::PolicyName(policy) << (host ? " with" : " without") << " the host tier");
      RunProperty(policy, host, 11 + static_cast<uint32_t>(policy) * 2 + host);
    }
  }
}

}  // namespace
}  // namespace duet

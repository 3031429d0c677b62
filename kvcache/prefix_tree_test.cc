// The knowledge tree's pieces on their own: the block hash, the policies'
// orders, document boundaries, and the tiers' moves. The random-operation
// property test against a brute-force model and the engine's BlockPool is
// //tests:kvcache_property_test.
#include "kvcache/prefix_tree.h"

#include <catch2/catch.hpp>
#include <map>
#include <vector>

#include "kvcache/block_hash.h"

namespace duet::kvcache {
namespace {

// Device blocks with reference counts and host slots, in maps.
class MapStore : public BlockStore {
 public:
  explicit MapStore(int64_t device, int64_t host) : device_left_(device), host_left_(host) {}
  void RefDevice(absl::Span<const int32_t> b) override {
    for (int32_t x : b) ++refs[x];
  }
  void UnrefDevice(absl::Span<const int32_t> b) override {
    for (int32_t x : b) {
      if (--refs[x] == 0) {
        refs.erase(x);
        ++device_left_;
      }
    }
  }
  absl::StatusOr<std::vector<int32_t>> AllocateDevice(int64_t n) override {
    if (n > device_left_) return absl::ResourceExhaustedError("device full");
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(next_++);
      refs[out.back()] = 1;
    }
    device_left_ -= n;
    return out;
  }
  absl::StatusOr<std::vector<int32_t>> AllocateHost(int64_t n) override {
    if (n > host_left_) return absl::ResourceExhaustedError("host full");
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(next_++);
    host_left_ -= n;
    return out;
  }
  void FreeHost(absl::Span<const int32_t> s) override { host_left_ += static_cast<int64_t>(s.size()); }
  void CopyToHost(absl::Span<const int32_t>, absl::Span<const int32_t> s) override { copies_out += s.size(); }
  void CopyToDevice(absl::Span<const int32_t> s, absl::Span<const int32_t>) override { copies_in += s.size(); }
  std::map<int32_t, int> refs;
  size_t copies_out = 0, copies_in = 0;

 private:
  int64_t device_left_, host_left_;
  int32_t next_ = 1000;
};

std::vector<int32_t> Seq(int32_t from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

// Inserts `tokens` computed into fresh blocks, then drops the sequence's own references.
void Compute(PrefixTree& tree, MapStore& store, const std::vector<int32_t>& tokens,
             std::vector<int64_t> boundaries = {}) {
  Match m = tree.Acquire(tokens);
  std::vector<int32_t> blocks = tree.SwapIn(m).value();
  for (int32_t b : blocks) ++store.refs[b];
  auto fresh = store.AllocateDevice(static_cast<int64_t>(tokens.size() / 4) - static_cast<int64_t>(blocks.size()));
  REQUIRE(fresh.ok());
  blocks.insert(blocks.end(), fresh->begin(), fresh->end());
  tree.Insert(tokens, blocks, boundaries);
  store.UnrefDevice(blocks);
  tree.Release(m);
}

TEST_CASE("the block hash chains the prefix and is the same in every process", "[kvcache]") {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint64_t> h = BlockHashes(a, 4);
  REQUIRE(h.size() == 2);  // the partial last block has none
  CHECK(h[0] == HashBlock(kRootHash, absl::MakeConstSpan(a).subspan(0, 4)));
  CHECK(h[1] == HashBlock(h[0], absl::MakeConstSpan(a).subspan(4, 4)));
  // The same second block after another first block hashes differently.
  const std::vector<int32_t> b = {9, 9, 9, 9, 5, 6, 7, 8};
  CHECK(BlockHashes(b, 4)[1] != h[1]);
  // A fixed value: the hash must not change across builds (the router and
  // workers of different builds compare them).
  CHECK(BlockHashes(std::vector<int32_t>{0, 1, 2, 3}, 4)[0] == HashBlock(kRootHash, std::vector<int32_t>{0, 1, 2, 3}));
}

TEST_CASE("a lookup finds the longest cached block-aligned prefix and splits a node there", "[kvcache]") {
  MapStore store(100, 0);
  PrefixTree tree({.block_size = 4}, &store);
  Compute(tree, store, Seq(0, 16));
  CHECK(tree.nodes() == 1);
  std::vector<int32_t> q = Seq(0, 10);  // 2 whole blocks shared
  q.push_back(99);
  Match m = tree.Lookup(q);
  CHECK(m.tokens == 8);
  CHECK(m.device_tokens == 8);
  CHECK(tree.nodes() == 2);  // split after 2 blocks
  CHECK(tree.CheckInvariants() == "");
  CHECK(tree.Lookup(Seq(1, 16)).tokens == 0);
}

TEST_CASE("documents start nodes, so a document under the same prefix is its own node", "[kvcache]") {
  MapStore store(100, 0);
  PrefixTree tree({.block_size = 4}, &store);
  std::vector<int32_t> sys = Seq(100, 4), doc_a = Seq(200, 8), doc_b = Seq(300, 8);
  std::vector<int32_t> ab = sys, ba = sys;
  ab.insert(ab.end(), doc_a.begin(), doc_a.end());
  ab.insert(ab.end(), doc_b.begin(), doc_b.end());
  ba.insert(ba.end(), doc_b.begin(), doc_b.end());
  ba.insert(ba.end(), doc_a.begin(), doc_a.end());
  Compute(tree, store, ab, {4, 12});
  CHECK(tree.nodes() == 3);  // system prompt, A, B after A
  Compute(tree, store, ba, {4, 12});
  CHECK(tree.nodes() == 5);  // B after the system prompt, A after B: order matters
  CHECK(tree.Lookup(ba).tokens == 20);
  CHECK(tree.CheckInvariants() == "");
}

TEST_CASE("LRU evicts the least recent leaf; PGDSF keeps what saves more per block", "[kvcache]") {
  for (Policy p : {Policy::kLru, Policy::kPgdsf}) {
    INFO(PolicyName(p));
    MapStore store(100, 0);
    // Cost: attention makes a long run dearer per token.
    PrefixTree tree({.block_size = 4, .policy = p,
                     .cost = [](int64_t, int64_t tokens) { return static_cast<double>(tokens * tokens); }},
                    &store);
    const std::vector<int32_t> expensive = Seq(0, 32);  // one node of 8 blocks
    std::vector<int32_t> cheap = Seq(500, 4);         // one block, a different root child
    Compute(tree, store, expensive);
    Compute(tree, store, cheap);  // the most recent
    tree.Evict(Tier::kDevice, 1);
    // LRU drops the older (expensive) node; PGDSF's priority per block is
    // higher for the node whose cost per token is higher.
    const bool expensive_left = tree.Lookup(expensive).tokens == 32;
    const bool cheap_left = tree.Lookup(cheap).tokens == 4;
    if (p == Policy::kLru) {
      CHECK(!expensive_left);
      CHECK(cheap_left);
    } else {
      CHECK(expensive_left);
      CHECK(!cheap_left);
    }
    CHECK(tree.CheckInvariants() == "");
  }
}

TEST_CASE("a pin without a hit (a waiting queue head) leaves the frequency LFU evicts by", "[kvcache]") {
  for (bool count : {false, true}) {
    INFO("counting the waits: " << count);
    MapStore store(100, 0);
    PrefixTree tree({.block_size = 4, .policy = Policy::kLfu}, &store);
    const std::vector<int32_t> waited = Seq(0, 8), used = Seq(500, 8);
    Compute(tree, store, waited);
    Compute(tree, store, used);
    // The first is pinned and given up three times, then used once; the
    // second is used twice.
    for (int i = 0; i < 3; ++i) tree.Release(tree.Acquire(waited, count));
    Match m = tree.Acquire(waited, false);
    tree.Hit(m);
    tree.Release(m);
    for (int i = 0; i < 2; ++i) tree.Release(tree.Acquire(used));
    tree.Evict(Tier::kDevice, 1);
    // Uncounted, the first has 2 uses against 3: it goes. Counted, its
    // waits would make it 5 and keep it.
    CHECK((tree.Lookup(waited).tokens == 0) == !count);
    CHECK((tree.Lookup(used).tokens == 0) == count);
    CHECK(tree.CheckInvariants() == "");
  }
}

TEST_CASE("evicted from device, a node moves to host once and comes back on a hit", "[kvcache]") {
  MapStore store(100, 100);
  PrefixTree tree({.block_size = 4, .host_tier = true}, &store);
  const std::vector<int32_t> s = Seq(0, 8);
  Compute(tree, store, s);
  CHECK(tree.Evict(Tier::kDevice, 2) == 2);
  CHECK(store.copies_out == 2);
  CHECK(tree.blocks(Tier::kDevice) == 0);
  CHECK(tree.blocks(Tier::kHost) == 2);
  Match m = tree.Acquire(s);
  CHECK(m.tokens == 8);
  CHECK(m.device_tokens == 0);  // on host only
  auto blocks = tree.SwapIn(m);
  REQUIRE(blocks.ok());
  CHECK(blocks->size() == 2);
  CHECK(store.copies_in == 2);
  CHECK(tree.blocks(Tier::kDevice) == 2);
  CHECK(tree.blocks(Tier::kHost) == 2);  // the host copy stays
  tree.Release(m);
  // Evicted again: it already has its host copy, so nothing is copied.
  CHECK(tree.Evict(Tier::kDevice, 2) == 2);
  CHECK(store.copies_out == 2);
  CHECK(tree.CheckInvariants() == "");
  // A pinned node is never evicted.
  Match pinned = tree.Acquire(s);
  CHECK(tree.Evict(Tier::kHost, 2) == 0);
  tree.Release(pinned);
  CHECK(tree.Evict(Tier::kHost, 2) == 2);
  CHECK(tree.nodes() == 0);
  CHECK(store.refs.empty());
}

TEST_CASE("policy names", "[kvcache]") {
  for (const char* n : {"lru", "lfu", "gdsf", "pgdsf"}) CHECK(PolicyName(ParsePolicy(n).value()) == std::string(n));
  CHECK(ParsePolicy("fifo").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::kvcache

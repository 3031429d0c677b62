#include "dispatch/dispatch.h"

#include "kvcache/block_hash.h"
#include "router/cache_index.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <vector>

namespace duet::router {
namespace {

dispatch::WorkerLoad Prefill(std::string id, int64_t queued) {
  return {.id = id, .role = dispatch::Role::kPrefill, .control_address = id + ":1", .queued_prefill_tokens = queued};
}
dispatch::WorkerLoad Decode(std::string id, int64_t free, int64_t running) {
  return {.id = id, .role = dispatch::Role::kDecode, .control_address = id + ":2", .kv_blocks_free = free,
          .running_requests = running};
}
dispatch::WorkerLoad Colocated(std::string id, int64_t queued, int64_t free) {
  return {.id = id, .role = dispatch::Role::kColocated, .control_address = id + ":3",
          .queued_prefill_tokens = queued, .kv_blocks_free = free};
}

// A policy through its interface, with the request's tokens optional.
struct Dispatch {
  explicit Dispatch(dispatch::DispatchPolicy p, const CacheIndex* index = nullptr, double uncached = 1, double queued = 1)
      : d(dispatch::NewDispatcher(p, {.cache = index, .uncached_weight = uncached, .queued_weight = queued}).value()) {}
  absl::StatusOr<dispatch::Assignment> Pick(absl::Span<const dispatch::WorkerLoad> w, absl::Span<const int32_t> prompt = {}) {
    return dispatch::Pick(*d, w, {.prompt = prompt});
  }
  std::unique_ptr<dispatch::Dispatcher> d;
};

TEST_CASE("least-loaded prefill: fewest queued prefill tokens, ties by id") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  std::vector<dispatch::WorkerLoad> w = {Prefill("p2", 300), Prefill("p0", 500), Prefill("p1", 100), Decode("d0", 10, 0)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "p1");
  CHECK(a->decode_id == "d0");
  CHECK(a->decode_address == "d0:2");
  // Same answer every time: least-loaded has no hidden state.
  CHECK(d.Pick(w)->prefill_id == "p1");
  w[2].queued_prefill_tokens = 300;  // p1 and p2 tie at 300: p1 (id order).
  CHECK(d.Pick(w)->prefill_id == "p1");
  w[2].queued_prefill_tokens = 301;
  CHECK(d.Pick(w)->prefill_id == "p2");
}

TEST_CASE("least-loaded decode: most free blocks, then fewest running") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  std::vector<dispatch::WorkerLoad> w = {Prefill("p0", 0), Decode("d0", 50, 1), Decode("d1", 80, 9), Decode("d2", 80, 3)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->decode_id == "d2");
  CHECK(a->decode_address == "d2:2");
  w[3].running_requests = 9;  // d1 and d2 tie on both: d1.
  CHECK(d.Pick(w)->decode_id == "d1");
  w[1].kv_blocks_free = 81;
  CHECK(d.Pick(w)->decode_id == "d0");
}

TEST_CASE("a colocated worker is its own decode") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  std::vector<dispatch::WorkerLoad> w = {Colocated("c0", 40, 5), Colocated("c1", 10, 1)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "c1");
  CHECK(a->decode_id == "c1");
  CHECK(a->decode_address == "c1:3");
}

TEST_CASE("colocated and disaggregated workers share the prefill choice") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  std::vector<dispatch::WorkerLoad> w = {Colocated("c0", 40, 5), Prefill("p0", 10), Decode("d0", 3, 0)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "p0");
  CHECK(a->decode_id == "d0");
  w[1].queued_prefill_tokens = 41;
  a = d.Pick(w);
  CHECK(a->prefill_id == "c0");
  CHECK(a->decode_id == "c0");
}

TEST_CASE("a prefill without any decode is not a candidate") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  std::vector<dispatch::WorkerLoad> w = {Prefill("p0", 0), Colocated("c0", 1000, 1)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "c0");
  CHECK(dispatch::CanServe(w).ok());
}

TEST_CASE("no live worker of a needed role is Unavailable naming it") {
  Dispatch d(dispatch::DispatchPolicy::kLeastLoaded);
  auto none = d.Pick({});
  CHECK(none.status().code() == absl::StatusCode::kUnavailable);
  CHECK(none.status().message() == "no live worker");
  std::vector<dispatch::WorkerLoad> only_prefill = {Prefill("p0", 0)};
  CHECK(d.Pick(only_prefill).status().message() == "no live decode worker");
  CHECK(dispatch::CanServe(only_prefill).code() == absl::StatusCode::kUnavailable);
  std::vector<dispatch::WorkerLoad> only_decode = {Decode("d0", 1, 0)};
  CHECK(d.Pick(only_decode).status().message() == "no live prefill worker");
  std::vector<dispatch::WorkerLoad> both = {Prefill("p0", 0), Decode("d0", 1, 0)};
  CHECK(dispatch::CanServe(both).ok());
}

TEST_CASE("round-robin cycles over prefills and decodes in id order") {
  Dispatch d(dispatch::DispatchPolicy::kRoundRobin);
  // Loads are ignored: p1 is busiest and still gets its turn.
  std::vector<dispatch::WorkerLoad> w = {Prefill("p1", 1000), Prefill("p0", 0), Decode("d1", 0, 50), Decode("d0", 90, 0),
                               Decode("d2", 5, 5)};
  std::vector<std::string> prefills, decodes;
  for (int i = 0; i < 6; ++i) {
    auto a = d.Pick(w);
    REQUIRE(a.ok());
    prefills.push_back(a->prefill_id);
    decodes.push_back(a->decode_id);
  }
  CHECK(prefills == std::vector<std::string>{"p0", "p1", "p0", "p1", "p0", "p1"});
  CHECK(decodes == std::vector<std::string>{"d0", "d1", "d2", "d0", "d1", "d2"});
}

TEST_CASE("round-robin over colocated workers spreads evenly") {
  Dispatch d(dispatch::DispatchPolicy::kRoundRobin);
  std::vector<dispatch::WorkerLoad> w = {Colocated("c0", 0, 1), Colocated("c1", 0, 1), Colocated("c2", 0, 1)};
  std::map<std::string, int> count;
  for (int i = 0; i < 9; ++i) {
    auto a = d.Pick(w);
    REQUIRE(a.ok());
    CHECK(a->prefill_id == a->decode_id);
    count[a->prefill_id]++;
  }
  CHECK(count == std::map<std::string, int>{{"c0", 3}, {"c1", 3}, {"c2", 3}});
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (salt * 97 + i * 13) % 900);
  return t;
}

// A worker's CacheEvents snapshot of the full 16-token blocks of `prompts`.
proto::CacheEvents Snapshot(uint64_t seq, const std::vector<std::vector<int32_t>>& prompts) {
  proto::CacheEvents e;
  e.set_seq(seq);
  e.set_snapshot(true);
  e.set_block_size(16);
  for (const auto& p : prompts) {
    for (uint64_t h : kvcache::BlockHashes(p, 16)) e.add_added(h);
  }
  return e;
}

TEST_CASE("the cache index: snapshots replace, deltas apply in order, a gap or a lost worker drops") {
  CacheIndex index;
  const std::vector<int32_t> a = Tokens(80, 1), b = Tokens(40, 2);
  // Deltas before any snapshot are not current.
  proto::CacheEvents early;
  early.set_seq(1);
  early.set_block_size(16);
  CHECK_FALSE(index.Apply("p0", early));
  REQUIRE(index.Apply("p0", Snapshot(4, {a})));
  CHECK(index.blocks("p0") == 5);
  // The last token is always computed: of 80 tokens, 4 blocks can be reused.
  CHECK(index.CachedTokens("p0", a) == 64);
  CHECK(index.CachedTokens("p0", std::vector<int32_t>(a.begin(), a.begin() + 40)) == 32);
  CHECK(index.CachedTokens("p0", b) == 0);
  CHECK(index.CachedTokens("p1", a) == 0);  // unknown worker
  // A delta: b's blocks in, a's last three out (their prefix stays).
  proto::CacheEvents delta;
  delta.set_seq(5);
  delta.set_block_size(16);
  for (uint64_t h : kvcache::BlockHashes(b, 16)) delta.add_added(h);
  const std::vector<uint64_t> ha = kvcache::BlockHashes(a, 16);
  for (size_t i = 2; i < ha.size(); ++i) delta.add_removed(ha[i]);
  REQUIRE(index.Apply("p0", delta));
  CHECK(index.CachedTokens("p0", a) == 32);
  CHECK(index.CachedTokens("p0", b) == 32);
  // A gap in seq: the worker's entries go until its next snapshot.
  delta.set_seq(7);
  CHECK_FALSE(index.Apply("p0", delta));
  CHECK(index.blocks("p0") == 0);
  REQUIRE(index.Apply("p0", Snapshot(8, {b})));
  CHECK(index.CachedTokens("p0", b) == 32);
  index.Drop("p0");
  CHECK(index.blocks("p0") == 0);
  CHECK(index.workers() == 0);
}

TEST_CASE("cache-aware prefill: the worker holding the prefix, unless its queue costs more than the prefix saves") {
  CacheIndex index;
  const std::vector<int32_t> prompt = Tokens(80, 3);
  std::vector<int32_t> other = Tokens(80, 4);
  // p1 holds the prompt's first 3 blocks (48 tokens), p0 an unrelated prompt.
  REQUIRE(index.Apply("p1", Snapshot(1, {std::vector<int32_t>(prompt.begin(), prompt.begin() + 48)})));
  REQUIRE(index.Apply("p0", Snapshot(1, {other})));
  Dispatch d(dispatch::DispatchPolicy::kCacheAware, &index);
  std::vector<dispatch::WorkerLoad> w = {Prefill("p0", 0), Prefill("p1", 20), Decode("d0", 10, 0)};
  // p1: 32 uncached + 20 queued = 52 against p0's 80 + 0.
  CHECK(d.Pick(w, prompt)->prefill_id == "p1");
  CHECK(d.Pick(w, prompt)->prefill_tokens == 32);  // what p1's queue is charged
  CHECK(d.Pick(w, prompt)->decode_id == "d0");
  // p1's queue grows past what its cache saves: 32 + 100 > 80.
  w[1].queued_prefill_tokens = 100;
  CHECK(d.Pick(w, prompt)->prefill_id == "p0");
  // With the queue weighed at 0, the cache alone decides.
  Dispatch cache_only(dispatch::DispatchPolicy::kCacheAware, &index, 1, 0);
  CHECK(cache_only.Pick(w, prompt)->prefill_id == "p1");
  // The other prompt is p0's.
  w[0].queued_prefill_tokens = 60;
  CHECK(d.Pick(w, other)->prefill_id == "p0");  // 16 + 60 against 80 + 100
  // Nothing cached anywhere: least-loaded's choice.
  const std::vector<int32_t> fresh = Tokens(80, 5);
  Dispatch least(dispatch::DispatchPolicy::kLeastLoaded);
  for (int64_t q : {0, 59, 61, 200}) {
    w[0].queued_prefill_tokens = q;
    INFO("p0 queued " << q);
    CHECK(d.Pick(w, fresh)->prefill_id == least.Pick(w, fresh)->prefill_id);
  }
  // A cache-aware dispatcher needs the index.
  CHECK_FALSE(dispatch::NewDispatcher(dispatch::DispatchPolicy::kCacheAware, {}).ok());
}

TEST_CASE("policy names parse") {
  CHECK(*dispatch::ParseDispatchPolicy("least_loaded") == dispatch::DispatchPolicy::kLeastLoaded);
  CHECK(*dispatch::ParseDispatchPolicy("round_robin") == dispatch::DispatchPolicy::kRoundRobin);
  CHECK(*dispatch::ParseDispatchPolicy("cache_aware") == dispatch::DispatchPolicy::kCacheAware);
  CHECK(dispatch::DispatchPolicyName(dispatch::DispatchPolicy::kCacheAware) == "cache_aware");
  auto bad = dispatch::ParseDispatchPolicy("random");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(dispatch::DispatchPolicyName(dispatch::DispatchPolicy::kRoundRobin) == "round_robin");
}

}  // namespace
}  // namespace duet::router

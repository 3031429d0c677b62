#include "prefill/scheduler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "absl/status/status.h"
#include "base/clock.h"
#include "engine/block_pool.h"
#include "kvcache/prefix_tree.h"
#include "kvtransfer/loopback/loopback_transport.h"
#include "worker/pool_block_store.h"

namespace duet::prefill {
namespace {

constexpr int64_t kBlockSize = 4;

// A pool of tiny blocks registered in a loopback transport, as the service does.
struct Fixture {
  explicit Fixture(int64_t num_blocks, SchedulerOptions options = {})
      : pool(kernels::KvLayout{.num_layers = 1, .num_kv_heads = 1, .block_size = kBlockSize, .head_dim = 2},
             num_blocks),
        transport(kvtransfer::NewLoopbackTransport()) {
    region = transport
                 ->RegisterRegion(pool.region_base(), static_cast<uint64_t>(pool.bytes()), num_blocks)
                 .value();
    sched = std::make_unique<PrefillScheduler>(options, &pool, transport.get(), region, &clock);
  }
  ~Fixture() {
    sched.reset();
    REQUIRE(pool.num_free() == pool.num_blocks());  // Every path returns every block.
    REQUIRE(transport->DeregisterRegion(region).ok());
  }
  static proto::PrefillRequest Request(uint64_t id, int prompt_len, int resume_len = 0) {
    proto::PrefillRequest r;
    r.set_request_id(id);
    for (int i = 0; i < prompt_len; ++i) r.mutable_spec()->add_prompt_ids(100 * static_cast<int>(id) + i);
    for (int i = 0; i < resume_len; ++i) r.add_resume_ids(7);
    return r;
  }
  void Enqueue(uint64_t id, int prompt_len, int resume_len = 0) {
    REQUIRE(sched->Enqueue(Request(id, prompt_len, resume_len), {}).ok());
  }

  FakeClock clock;
  engine::BlockPool pool;
  kvtransfer::KvTransportPtr transport;
  kvtransfer::RegionId region = 0;
  std::unique_ptr<PrefillScheduler> sched;
};

struct ChunkView {
  uint64_t id;
  int64_t start;
  int64_t len;
  bool last;
  bool operator==(const ChunkView&) const = default;
};

std::vector<ChunkView> View(const Step& s) {
  std::vector<ChunkView> v;
  for (const auto& c : s.chunks) {
    v.push_back({c.request_id, c.start_pos, static_cast<int64_t>(c.tokens.size()), c.last});
  }
  return v;
}

TEST_CASE("FCFS batches several prompts within the token budget", "[prefill][scheduler]") {
  Fixture f(64, {.max_batch_tokens = 10});
  f.Enqueue(1, 4);
  f.Enqueue(2, 3, 2);  // Resumed tokens are prefilled too.
  f.Enqueue(3, 6);
  REQUIRE(f.sched->queued_prefill_tokens() == 15);
  Step s = f.sched->Schedule();
  REQUIRE(View(s) == std::vector<ChunkView>{{1, 0, 4, true}, {2, 0, 5, true}, {3, 0, 1, false}});
  REQUIRE(s.queue_times.size() == 3);
  REQUIRE(s.chunks[1].tokens[3] == 7);  // prompt then resume
  REQUIRE(f.sched->num_running() == 3);
  REQUIRE(f.sched->Complete(s) == std::vector<uint64_t>{1, 2});
  REQUIRE(f.sched->prompt_tokens_computed() == 10);
  REQUIRE(f.sched->queued_prefill_tokens() == 5);
  REQUIRE(f.sched->Find(1) != nullptr);
  f.sched->Finish(1);
  f.sched->Finish(2);
  REQUIRE(f.sched->Find(1) == nullptr);

  s = f.sched->Schedule();
  REQUIRE(View(s) == std::vector<ChunkView>{{3, 1, 5, true}});
  REQUIRE(s.chunks[0].tokens[0] == 301);
  REQUIRE(f.sched->Complete(s) == std::vector<uint64_t>{3});
  f.sched->Finish(3);
  REQUIRE(f.sched->Schedule().empty());
}

TEST_CASE("a long prompt is chunked across steps with all its blocks reserved", "[prefill][scheduler]") {
  Fixture f(64, {.max_batch_tokens = 8});
  f.Enqueue(1, 21);
  f.Enqueue(2, 3);
  std::vector<std::vector<ChunkView>> steps;
  for (int i = 0; i < 3; ++i) {
    Step s = f.sched->Schedule();
    steps.push_back(View(s));
    REQUIRE(s.chunks[0].block_table.size() == 6);  // ceil(21 / 4), from the first step on
    f.sched->Complete(s);
  }
  REQUIRE(steps[0] == std::vector<ChunkView>{{1, 0, 8, false}});
  REQUIRE(steps[1] == std::vector<ChunkView>{{1, 8, 8, false}});
  // The budget's remainder goes to the next request in line.
  REQUIRE(steps[2] == std::vector<ChunkView>{{1, 16, 5, true}, {2, 0, 3, true}});
  REQUIRE(f.sched->prompt_tokens_computed() == 24);
  REQUIRE(f.pool.num_free() == 64 - 6 - 1);
  f.sched->Finish(1);
  f.sched->Finish(2);
}

TEST_CASE("the queue head waits for blocks held by leases; nothing overtakes it", "[prefill][scheduler]") {
  Fixture f(4, {.max_batch_tokens = 64});
  f.Enqueue(1, 12);  // 3 of the 4 blocks
  Step s = f.sched->Schedule();
  f.sched->Complete(s);
  auto lease = f.sched->Lease(1);
  REQUIRE(lease.ok());
  REQUIRE(lease->block_epochs.size() == 3);
  REQUIRE(f.sched->leased_blocks() == 3);

  f.Enqueue(2, 8);  // 2 blocks: waits
  f.Enqueue(3, 4);  // 1 block would fit, but FCFS
  REQUIRE(f.sched->Schedule().empty());
  REQUIRE(f.sched->Schedule().empty());
  REQUIRE(f.sched->num_queued() == 2);

  REQUIRE(f.sched->Release(1) == 3);
  REQUIRE(f.sched->leased_blocks() == 0);
  for (const auto& [b, epoch] : lease->block_epochs) {
    REQUIRE(f.transport->BlockEpoch(f.region, b) == epoch + 1);  // Bumped before reuse.
  }
  s = f.sched->Schedule();
  REQUIRE(View(s) == std::vector<ChunkView>{{2, 0, 8, true}, {3, 0, 4, true}});
  f.sched->Complete(s);
  f.sched->Finish(2);
  f.sched->Finish(3);
  REQUIRE(f.sched->Release(1) == 0);  // Already gone.
}

TEST_CASE("cancel drops a request in every state and frees its blocks", "[prefill][scheduler]") {
  Fixture f(16, {.max_batch_tokens = 8});
  f.Enqueue(1, 4);   // will be leased
  f.Enqueue(2, 4);   // will be complete
  f.Enqueue(3, 10);  // mid-chunk
  f.Enqueue(4, 4);   // still queued (budget spent)
  Step s = f.sched->Schedule();
  f.sched->Complete(s);
  s = f.sched->Schedule();
  REQUIRE(View(s) == std::vector<ChunkView>{{3, 0, 8, false}});
  f.sched->Complete(s);
  auto lease = f.sched->Lease(1);
  REQUIRE(lease.ok());
  REQUIRE(f.sched->num_queued() == 1);
  REQUIRE(f.sched->num_running() == 1);
  REQUIRE(f.pool.num_free() == 16 - 1 - 1 - 3);

  REQUIRE(f.sched->Cancel(4));  // queued
  REQUIRE(f.sched->Cancel(3));  // mid-chunk
  REQUIRE(f.sched->Cancel(2));  // complete
  REQUIRE(f.sched->Cancel(1));  // leased: epochs bumped first
  REQUIRE(f.transport->BlockEpoch(f.region, lease->block_epochs[0].first) ==
          lease->block_epochs[0].second + 1);
  REQUIRE_FALSE(f.sched->Cancel(1));
  REQUIRE_FALSE(f.sched->Cancel(99));
  REQUIRE(f.pool.num_free() == 16);
  REQUIRE(f.sched->queued_prefill_tokens() == 0);
  REQUIRE(f.sched->Schedule().empty());
}

TEST_CASE("an expired lease returns its blocks, on the injected clock", "[prefill][scheduler]") {
  Fixture f(8, {.lease_duration = absl::Seconds(5)});
  f.Enqueue(1, 9);
  Step s = f.sched->Schedule();
  f.sched->Complete(s);
  auto lease = f.sched->Lease(1);
  REQUIRE(lease.ok());
  REQUIRE(f.pool.num_free() == 5);
  f.clock.Advance(absl::Seconds(4));
  REQUIRE(f.sched->ExpireDue() == 0);
  REQUIRE(f.pool.num_free() == 5);
  f.clock.Advance(absl::Seconds(1));
  REQUIRE(f.sched->ExpireDue() == 1);
  REQUIRE(f.pool.num_free() == 8);
  REQUIRE(f.sched->leased_blocks() == 0);
  REQUIRE(f.sched->lease_expirations() == 1);
  REQUIRE(f.transport->BlockEpoch(f.region, lease->block_epochs[2].first) == lease->block_epochs[2].second + 1);
  REQUIRE(f.sched->Release(1) == 0);  // A late KvReleased is harmless.
  REQUIRE_FALSE(f.sched->CancelLease(1));
}

TEST_CASE("admission limits: queue full, prompts larger than the pool, duplicates", "[prefill][scheduler]") {
  Fixture f(4, {.max_batch_tokens = 64, .max_queued_requests = 2});
  f.Enqueue(1, 4);
  f.Enqueue(2, 4);
  absl::Status s = f.sched->Enqueue(Fixture::Request(3, 4), {});
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(s.message() == "prefill queue full");
  REQUIRE(f.sched->Enqueue(Fixture::Request(1, 4), {}).code() == absl::StatusCode::kAlreadyExists);

  Step step = f.sched->Schedule();  // Admission makes room in the queue.
  REQUIRE(f.sched->num_queued() == 0);
  REQUIRE(f.sched->Enqueue(Fixture::Request(2, 4), {}).code() == absl::StatusCode::kAlreadyExists);  // running
  s = f.sched->Enqueue(Fixture::Request(5, 17), {});  // 5 blocks > 4: could never run
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(std::string(s.message()).find("needs 5 KV blocks") != std::string::npos);
  f.Enqueue(4, 16);
  f.sched->Complete(step);
  f.sched->Finish(1);
  f.sched->Finish(2);
}

TEST_CASE("router loss drops unleased requests; leases stay until they end", "[prefill][scheduler]") {
  Fixture f(16, {.max_batch_tokens = 6});
  f.Enqueue(1, 4);
  Step s = f.sched->Schedule();
  f.sched->Complete(s);
  REQUIRE(f.sched->Lease(1).ok());
  f.Enqueue(2, 10);
  f.Enqueue(3, 4);
  s = f.sched->Schedule();
  f.sched->Complete(s);  // 2 is mid-chunk, 3 queued
  REQUIRE(f.sched->DropUnleased() == std::vector<uint64_t>{3, 2});
  REQUIRE(f.sched->num_leased() == 1);
  REQUIRE(f.pool.num_free() == 15);
  REQUIRE(f.sched->Release(1) == 1);
  REQUIRE(f.pool.num_free() == 16);
}

TEST_CASE("destroying the scheduler ends live leases and frees everything", "[prefill][scheduler]") {
  std::vector<std::pair<int32_t, uint64_t>> epochs;
  {
    Fixture f(8);
    f.Enqueue(1, 5);
    f.Enqueue(2, 3);
    Step s = f.sched->Schedule();
    f.sched->Complete(s);
    auto lease = f.sched->Lease(1);
    REQUIRE(lease.ok());
    epochs = lease->block_epochs;
    f.sched.reset();
    for (const auto& [b, e] : epochs) REQUIRE(f.transport->BlockEpoch(f.region, b) == e + 1);
    // ~Fixture checks the pool is whole again.
  }
}

TEST_CASE("choices of one prompt share its full blocks; the partial block is copied; leases end apart",
          "[prefill][scheduler]") {
  Fixture f(16);
  // 10 tokens in blocks of 4: two full blocks and a partial one.
  spec::GenerationParams params;
  params.sampling.temperature = 0.25f;
  params.sampling.seed = 9;
  params.choice_index = 1;
  REQUIRE(f.sched->Enqueue(Fixture::Request(1, 10), params).ok());
  Step step = f.sched->Schedule();
  REQUIRE(f.sched->Complete(step) == std::vector<uint64_t>{1});
  const PrefillSequence* parent = f.sched->Find(1);
  const std::vector<int32_t> pb = parent->kv.block_table();
  REQUIRE(pb.size() == 3);
  // Something recognisable in the parent's partial block.
  const int64_t floats = f.pool.layout().BlockStride();
  std::vector<float> parent_block(static_cast<size_t>(floats));
  for (int64_t i = 0; i < floats; ++i) parent_block[static_cast<size_t>(i)] = static_cast<float>(i) + 0.5f;
  REQUIRE(f.pool.WriteBlock(pb[2], parent_block.data()).ok());

  CHECK(parent->params.choice_index == 1);
  proto::PrefillRequest sib = Fixture::Request(2, 0);
  *sib.mutable_spec() = parent->request.spec();
  sib.mutable_spec()->set_choice_index(3);
  REQUIRE(f.sched->Fork(1, sib).ok());
  const PrefillSequence* child = f.sched->Find(2);
  REQUIRE(child != nullptr);
  // The choice's parameters are the parent's but for its own choice index.
  CHECK(child->params.choice_index == 3);
  CHECK(child->params.sampling.temperature == 0.25f);
  CHECK(child->params.sampling.seed == 9);
  const std::vector<int32_t> cb = child->kv.block_table();
  REQUIRE(cb.size() == 3);
  CHECK(cb[0] == pb[0]);
  CHECK(cb[1] == pb[1]);
  CHECK(cb[2] != pb[2]);
  CHECK(f.pool.RefCount(pb[0]) == 2);
  CHECK(f.pool.RefCount(pb[2]) == 1);
  std::vector<float> child_block(static_cast<size_t>(floats));
  REQUIRE(f.pool.ReadBlock(cb[2], child_block.data()).ok());
  for (int64_t i = 0; i < floats; ++i) REQUIRE(child_block[static_cast<size_t>(i)] == static_cast<float>(i) + 0.5f);
  CHECK(f.pool.num_free() == 16 - 4);  // 3 of the parent's + 1 copy

  // A different prompt or a held id is refused.
  proto::PrefillRequest other = Fixture::Request(3, 10);
  CHECK(f.sched->Fork(1, other).code() == absl::StatusCode::kInvalidArgument);
  CHECK(f.sched->Fork(1, sib).code() == absl::StatusCode::kAlreadyExists);

  // Both leased: the shared blocks keep their epochs until the last lease ends.
  auto l1 = f.sched->Lease(1);
  auto l2 = f.sched->Lease(2);
  REQUIRE(l1.ok());
  REQUIRE(l2.ok());
  const uint64_t shared_epoch = f.transport->BlockEpoch(f.region, pb[0]);
  CHECK(f.sched->Release(1) == 3);
  CHECK(f.transport->BlockEpoch(f.region, pb[0]) == shared_epoch);  // still promised to 2
  CHECK(f.transport->BlockEpoch(f.region, pb[2]) != l1->block_epochs[2].second);  // 1's own block moved on
  CHECK(f.pool.RefCount(pb[0]) == 1);
  CHECK(f.sched->Release(2) == 3);
  CHECK(f.transport->BlockEpoch(f.region, pb[0]) != shared_epoch);
  CHECK(f.pool.num_free() == 16);

  // A prompt of whole blocks: the choices share every block.
  f.Enqueue(4, 8);
  step = f.sched->Schedule();
  REQUIRE(f.sched->Complete(step) == std::vector<uint64_t>{4});
  proto::PrefillRequest sib5 = Fixture::Request(5, 0);
  *sib5.mutable_spec() = f.sched->Find(4)->request.spec();
  REQUIRE(f.sched->Fork(4, sib5).ok());
  CHECK(f.sched->Find(5)->kv.block_table() == f.sched->Find(4)->kv.block_table());
  CHECK(f.pool.num_free() == 14);
  REQUIRE(f.sched->Lease(4).ok());
  REQUIRE(f.sched->Lease(5).ok());
  CHECK(f.sched->Release(5) == 2);
  CHECK(f.sched->Release(4) == 2);
}


// --- With the knowledge tree.

// The fixture's pool and transport, with a tree over the pool.
struct CachedFixture {
  explicit CachedFixture(int64_t num_blocks, int64_t budget = 64, int64_t window = 0)
      : pool(kernels::KvLayout{.num_layers = 1, .num_kv_heads = 1, .block_size = kBlockSize, .head_dim = 2},
             num_blocks),
        transport(kvtransfer::NewLoopbackTransport()),
        store(&pool, 0),
        tree(std::make_unique<kvcache::PrefixTree>(kvcache::TreeOptions{.block_size = kBlockSize}, &store)) {
    region = transport->RegisterRegion(pool.region_base(), static_cast<uint64_t>(pool.bytes()), num_blocks)
                 .value();
    sched = std::make_unique<PrefillScheduler>(
        SchedulerOptions{.max_batch_tokens = budget, .cache = tree.get(), .reorder_window = window}, &pool,
        transport.get(), region, &clock);
  }
  ~CachedFixture() {
    sched.reset();
    for (const auto& e : tree->Entries()) REQUIRE(e.pins == 0);  // every request unpinned its path
    tree.reset();
    REQUIRE(pool.num_free() == pool.num_blocks());
    REQUIRE(transport->DeregisterRegion(region).ok());
  }
  // Runs a request of `tokens` to completion in one step; returns (start, length) of its chunk.
  std::pair<int64_t, int64_t> Run(uint64_t id, const std::vector<int32_t>& tokens, std::vector<int32_t>* blocks = nullptr,
                                  const std::vector<int32_t>& boundaries = {}) {
    proto::PrefillRequest r;
    r.set_request_id(id);
    for (int32_t t : tokens) r.mutable_spec()->add_prompt_ids(t);
    for (int32_t b : boundaries) r.mutable_spec()->add_cache_boundaries(b);
    REQUIRE(sched->Enqueue(r, {}).ok());
    Step s = sched->Schedule();
    REQUIRE(s.chunks.size() == 1);
    REQUIRE(s.chunks[0].last);
    if (blocks != nullptr) blocks->assign(s.chunks[0].block_table.begin(), s.chunks[0].block_table.end());
    const std::pair<int64_t, int64_t> out = {s.chunks[0].start_pos, static_cast<int64_t>(s.chunks[0].tokens.size())};
    REQUIRE(sched->Complete(s) == std::vector<uint64_t>{id});
    return out;
  }

  FakeClock clock;
  engine::BlockPool pool;
  kvtransfer::KvTransportPtr transport;
  kvtransfer::RegionId region = 0;
  worker::PoolBlockStore store;
  std::unique_ptr<kvcache::PrefixTree> tree;
  std::unique_ptr<PrefillScheduler> sched;
};

std::vector<int32_t> Tokens(int from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

TEST_CASE("with the tree, a prompt starts after its longest cached block-aligned prefix", "[prefill][scheduler]") {
  CachedFixture f(64);
  std::vector<int32_t> first_blocks, again_blocks;
  const std::vector<int32_t> prompt = Tokens(100, 22);
  CHECK(f.Run(1, prompt, &first_blocks) == std::pair<int64_t, int64_t>{0, 22});  // nothing cached yet
  f.sched->Finish(1);
  // The same prompt: 5 full blocks (20 tokens) cached; their blocks are the first run's.
  CHECK(f.Run(2, prompt, &again_blocks) == std::pair<int64_t, int64_t>{20, 2});
  CHECK(std::vector<int32_t>(again_blocks.begin(), again_blocks.begin() + 5) ==
        std::vector<int32_t>(first_blocks.begin(), first_blocks.begin() + 5));
  CHECK(f.pool.RefCount(again_blocks[5]) == 1);  // the partial last block is the request's own
  CHECK(f.pool.RefCount(again_blocks[0]) == 2);  // a cached one: the tree's and the request's
  // A prompt sharing 2 blocks and then differing.
  std::vector<int32_t> other = Tokens(100, 9);
  other.push_back(7);
  CHECK(f.Run(3, other) == std::pair<int64_t, int64_t>{8, 2});
  // A prompt that is whole cached blocks still computes its last block: the
  // last token's logits give token 1.
  CHECK(f.Run(4, Tokens(100, 20)) == std::pair<int64_t, int64_t>{16, 4});
  CHECK(f.sched->cache_query_tokens() == 22 + 22 + 10 + 20);
  CHECK(f.sched->cache_hit_tokens(kvcache::Tier::kDevice) == 20 + 8 + 16);
  CHECK(f.sched->prompt_tokens_computed() == 22 + 2 + 2 + 4);
  // Leased, the cached path stays pinned; released, it is free to evict.
  REQUIRE(f.sched->Lease(2).ok());
  CHECK(f.tree->Evict(kvcache::Tier::kDevice, 100) < 5);
  CHECK(f.sched->Release(2) > 0);
  f.sched->Finish(3);
  f.sched->Finish(4);
}

TEST_CASE("a request's document boundaries start the tree's nodes, rounded down to blocks", "[prefill][scheduler]") {
  CachedFixture f(64);
  // 30 tokens: a system prompt [0, 5), a document [5, 18), the question [18, 30).
  f.Run(1, Tokens(100, 30), nullptr, {5, 18});
  f.sched->Finish(1);
  // Full blocks of 4: 7 of them; nodes at blocks [0, 1) [1, 4) [4, 7).
  std::vector<int64_t> sizes;
  for (const auto& e : f.tree->Entries()) sizes.push_back(e.node_tokens);
  std::sort(sizes.begin(), sizes.end());
  CHECK(sizes == std::vector<int64_t>{4, 12, 12});
}

TEST_CASE("with the pool full of cached blocks, the queue head evicts them to fit", "[prefill][scheduler]") {
  CachedFixture f(8);
  f.Run(1, Tokens(0, 16));  // 4 blocks
  f.sched->Finish(1);
  f.Run(2, Tokens(500, 16));  // 4 more: the pool is all cache now
  f.sched->Finish(2);
  CHECK(f.pool.num_free() == 0);
  CHECK(f.Run(3, Tokens(900, 16)) == std::pair<int64_t, int64_t>{0, 16});  // fits by evicting
  CHECK(f.tree->blocks(kvcache::Tier::kDevice) == 8);
  f.sched->Finish(3);
}

// The order requests are first scheduled in, running every step to its end.
std::vector<uint64_t> AdmissionOrder(CachedFixture& f) {
  std::vector<uint64_t> order;
  for (Step s = f.sched->Schedule(); !s.empty(); s = f.sched->Schedule()) {
    for (const auto& c : s.chunks) {
      if (std::find(order.begin(), order.end(), c.request_id) == order.end()) order.push_back(c.request_id);
    }
    for (uint64_t id : f.sched->Complete(s)) f.sched->Finish(id);
  }
  return order;
}

TEST_CASE("cache-aware reordering admits cached prompts first, overtaking nobody by more than the window",
          "[prefill][scheduler]") {
  for (int64_t window : {0, 2}) {
    INFO("window " << window);
    CachedFixture f(64, /*budget=*/16, window);
    const std::vector<int32_t> cached = Tokens(100, 16);
    f.Run(1, cached);
    f.sched->Finish(1);
    // Queued: two prompts the tree lacks, then three it holds (12 tokens each).
    auto enqueue = [&](uint64_t id, const std::vector<int32_t>& t) {
      proto::PrefillRequest r;
      r.set_request_id(id);
      for (int32_t x : t) r.mutable_spec()->add_prompt_ids(x);
      REQUIRE(f.sched->Enqueue(r, {}).ok());
    };
    enqueue(10, Tokens(300, 16));
    enqueue(11, Tokens(400, 16));
    for (uint64_t id : {12, 13, 14}) enqueue(id, cached);
    const std::vector<uint64_t> order = AdmissionOrder(f);
    if (window == 0) {
      CHECK(order == std::vector<uint64_t>{10, 11, 12, 13, 14});  // first come, first served
    } else {
      // 12 and 13 go first; then 10 and 11 have been overtaken twice, the
      // window, and nothing passes them again.
      CHECK(order == std::vector<uint64_t>{12, 13, 10, 11, 14});
    }
    // The first three admitted hold 12 cached tokens each when cached.
    int cached_first = 0;
    for (size_t i = 0; i < 3; ++i) cached_first += order[i] >= 12;
    CHECK(cached_first == (window == 0 ? 1 : 2));
  }
}

}  // namespace
}  // namespace duet::prefill

// One dispatch (dispatch/), two callers: the router, with its CacheIndex
// kept from the workers' cache events, and the simulator
// (placement::SimDispatch), over its instances and their prefix trees.
// Given the same workers in the same state, they pick the same prefill and
// decode and charge the same tokens, under every policy, pick after pick
// (each pick's charge and decode request applied to both).
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/dispatch.h"
#include "kvcache/block_hash.h"
#include "kvcache/prefix_tree.h"
#include "placement/sim_dispatch.h"
#include "router/cache_index.h"

namespace duet::testing {
namespace {

constexpr int64_t kBlock = 16;

// Block ids, no data: the trees here never evict.
class Ids : public kvcache::BlockStore {
 public:
  void RefDevice(absl::Span<const int32_t>) override {}
  void UnrefDevice(absl::Span<const int32_t>) override {}
  absl::StatusOr<std::vector<int32_t>> AllocateDevice(int64_t n) override {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(next_++);
    return out;
  }
  absl::StatusOr<std::vector<int32_t>> AllocateHost(int64_t) override {
    return absl::ResourceExhaustedError("no host tier");
  }
  void FreeHost(absl::Span<const int32_t>) override {}
  void CopyToHost(absl::Span<const int32_t>, absl::Span<const int32_t>) override {}
  void CopyToDevice(absl::Span<const int32_t>, absl::Span<const int32_t>) override {}

 private:
  int32_t next_ = 0;
};

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (salt * 97 + i * 13) % 900);
  return t;
}

struct Worker {
  std::string id;  // the router's; sorts within its role as the instances' indices do
  placement::InstanceRole role;
  int64_t queued = 0;
  int64_t free = 0;  // decode: KV blocks free
  int64_t running = 0;
  std::vector<std::vector<int32_t>> cached;  // prompts whose full blocks its cache holds
};

dispatch::Role RouterRole(placement::InstanceRole r) {
  switch (r) {
    case placement::InstanceRole::kPrefill: return dispatch::Role::kPrefill;
    case placement::InstanceRole::kDecode: return dispatch::Role::kDecode;
    case placement::InstanceRole::kColocated: break;
  }
  return dispatch::Role::kColocated;
}

// Both sides over `workers`, pick after pick.
void ExpectSamePicks(const std::string& policy, std::vector<Worker> workers,
                     const std::vector<std::vector<int32_t>>& requests) {
  INFO("policy " << policy);
  const CacheAwareWeights weights{.uncached = 1, .queued = 0.5};
  // The router: its index from each worker's snapshot event.
  router::CacheIndex index;
  for (const Worker& w : workers) {
    if (w.role == placement::InstanceRole::kDecode) continue;
    proto::CacheEvents e;
    e.set_seq(1);
    e.set_snapshot(true);
    e.set_block_size(kBlock);
    for (const auto& p : w.cached) {
      for (uint64_t h : kvcache::BlockHashes(p, kBlock)) e.add_added(h);
    }
    REQUIRE(index.Apply(w.id, e));
  }
  auto router = dispatch::NewDispatcher(dispatch::ParseDispatchPolicy(policy).value(),
                                        {.cache = &index, .uncached_weight = weights.uncached,
                                         .queued_weight = weights.queued});
  REQUIRE(router.ok());
  // The simulator: a tree per prefill instance holding the same prompts.
  Ids store;
  std::vector<std::unique_ptr<kvcache::PrefixTree>> trees;
  for (const Worker& w : workers) {
    if (w.role == placement::InstanceRole::kDecode) {
      trees.push_back(nullptr);
      continue;
    }
    trees.push_back(std::make_unique<kvcache::PrefixTree>(kvcache::TreeOptions{.block_size = kBlock}, &store));
    for (const auto& p : w.cached) {
      const std::vector<int32_t> blocks = store.AllocateDevice(static_cast<int64_t>(p.size()) / kBlock).value();
      trees.back()->Insert(p, blocks);
    }
  }
  placement::SimDispatch sim(policy, weights);

  for (size_t k = 0; k < requests.size(); ++k) {
    INFO("request " << k);
    const std::vector<int32_t>& prompt = requests[k];
    std::vector<dispatch::WorkerLoad> loads;
    std::vector<placement::InstanceLoad> instances;
    for (size_t i = 0; i < workers.size(); ++i) {
      const Worker& w = workers[i];
      loads.push_back({.id = w.id, .role = RouterRole(w.role), .control_address = w.id + ":1",
                       .queued_prefill_tokens = w.queued, .kv_blocks_free = w.free, .running_requests = w.running});
      instances.push_back({.role = w.role, .charged_tokens = w.queued, .kv_used = 0,
                           .kv_cap = static_cast<double>(w.free), .requests = w.running, .tree = trees[i].get()});
    }
    absl::StatusOr<dispatch::Assignment> a = dispatch::Pick(**router, loads, {.prompt = prompt});
    REQUIRE(a.ok());
    const placement::SimDispatch::Pick p = sim.PickPrefill(instances, prompt, static_cast<int64_t>(prompt.size()));
    CHECK(workers[static_cast<size_t>(p.instance)].id == a->prefill_id);
    const int64_t router_charge = a->prefill_tokens >= 0 ? a->prefill_tokens : static_cast<int64_t>(prompt.size());
    CHECK(p.charged == router_charge);
    Worker& prefill = workers[static_cast<size_t>(p.instance)];
    prefill.queued += p.charged;
    if (prefill.role == placement::InstanceRole::kColocated) {
      CHECK(a->decode_id == a->prefill_id);
      continue;
    }
    const int32_t d = sim.PickDecode(instances);
    CHECK(workers[static_cast<size_t>(d)].id == a->decode_id);
    Worker& decode = workers[static_cast<size_t>(d)];
    decode.running += 1;
    decode.free -= (static_cast<int64_t>(prompt.size()) + kBlock) / kBlock;
  }
}

TEST_CASE("the router and the simulator dispatch alike under every policy", "[dispatch]") {
  const std::vector<int32_t> doc_a = Tokens(96, 1), doc_b = Tokens(64, 2), other = Tokens(80, 3);
  auto with = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // p1 holds doc_a, p2 holds doc_b; p0 is the least loaded; decodes differ
  // in free blocks and running requests.
  const std::vector<Worker> disaggregated = {
      {.id = "p0", .role = placement::InstanceRole::kPrefill, .queued = 30},
      {.id = "p1", .role = placement::InstanceRole::kPrefill, .queued = 120, .cached = {doc_a}},
      {.id = "p2", .role = placement::InstanceRole::kPrefill, .queued = 70, .cached = {doc_b}},
      {.id = "d0", .role = placement::InstanceRole::kDecode, .free = 40, .running = 2},
      {.id = "d1", .role = placement::InstanceRole::kDecode, .free = 44, .running = 5},
  };
  const std::vector<Worker> colocated = {
      {.id = "c0", .role = placement::InstanceRole::kColocated, .queued = 10, .free = 50, .cached = {doc_b}},
      {.id = "c1", .role = placement::InstanceRole::kColocated, .queued = 0, .free = 50},
      {.id = "c2", .role = placement::InstanceRole::kColocated, .queued = 40, .free = 50, .cached = {doc_a}},
  };
  const std::vector<std::vector<int32_t>> requests = {
      with(doc_a, Tokens(20, 4)), with(doc_b, Tokens(20, 5)), other, with(doc_a, Tokens(30, 6)),
      with(doc_b, Tokens(10, 7)), Tokens(40, 8), with(doc_a, Tokens(5, 9)), with(doc_b, Tokens(50, 10)),
  };
  for (const char* policy : {"least_loaded", "round_robin", "cache_aware"}) {
    ExpectSamePicks(policy, disaggregated, requests);
    ExpectSamePicks(policy, colocated, requests);
  }
}

}  // namespace
}  // namespace duet::testing

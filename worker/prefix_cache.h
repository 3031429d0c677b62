// PrefixCache: a worker's knowledge tree with what a serving worker needs
// around it, in one home for the prefill and the colocated worker: the tree
// over the engine pool and a host region (PoolBlockStore), PGDSF's cost, the
// `duet_prefix_cache_*` metrics, the blocks a request can take now, reset,
// and the events that keep the router's index of cached prefixes current.
//
//   ASSIGN_OR_RETURN(auto cache, PrefixCache::Create(options, pool, model_dir, config));
//   kvcache::PrefixTree* tree = cache->tree();   // nullptr when options.enabled is false
//   ... the scheduler acquires, swaps in, inserts ...
//   cache->Publish(query_tokens, hit_device_tokens, hit_host_tokens);  // each stats tick
//
// PGDSF's cost of a node is the prefill time it saves: with a `duet profile`
// (or DistServe-format) file, the file's prefill model of this model, the
// time of prefix + node tokens less that of the prefix; without one, the
// FLOPs of computing the node's tokens after the prefix (weights' 24 h^2 per
// layer and token, attention's 4 h per layer and context position). Only
// ratios between nodes matter to the policy.
//
// Not thread-safe: the worker's engine thread owns it, as it owns the tree.
#ifndef DUET_WORKER_PREFIX_CACHE_H_
#define DUET_WORKER_PREFIX_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "absl/status/statusor.h"
#include "base/metrics.h"
#include "engine/block_pool.h"
#include "spec/model_config.h"
#include "kvcache/prefix_tree.h"
#include "proto/control.pb.h"
#include "worker/pool_block_store.h"

namespace duet::worker {

struct PrefixCacheOptions {
  bool enabled = true;  // Reuse of cached prompt prefixes; off: every prompt is computed whole.
  int64_t host_memory_bytes = 0;  // The host tier in bytes ...
  int64_t host_blocks = 0;        // ... or in blocks (wins when > 0); 0 and 0: no host tier.
  kvcache::Policy policy = kvcache::Policy::kPgdsf;
  std::string cost_profile;  // A latency profile file for PGDSF's cost; empty: the model's FLOPs.
};

class PrefixCache {
 public:
  // `pool` must outlive the cache; `model_dir` names the model for a cost profile.
  static absl::StatusOr<std::unique_ptr<PrefixCache>> Create(const PrefixCacheOptions& options,
                                                             engine::BlockPool* pool, const std::string& model_dir,
                                                             const spec::ModelConfig& config);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  kvcache::PrefixTree* tree() { return tree_.get(); }  // nullptr: off
  // Device blocks the tree holds (some may be running requests' too).
  int64_t device_blocks() const;
  // Blocks a new request can have now: the pool's free ones and those only
  // the tree holds (it evicts them on demand). At idle, the whole pool.
  int64_t AvailableBlocks() const;
  // Drops every unpinned entry of both tiers; returns the blocks dropped.
  int64_t Reset();
  // The metrics, from the scheduler's running totals: prompt tokens looked
  // up and found on device and on host since start. With the cache off,
  // every token is a miss in both tiers (a 0% hit rate, not no data).
  void Publish(int64_t query_tokens, int64_t hit_device_tokens, int64_t hit_host_tokens);
  // One line for the log at shutdown: evictions and swaps.
  std::string Summary() const;
  // The router's index of this cache: what changed since the last call, or
  // (after RequestSnapshot) every hash held, as the next CacheEvents; false
  // when there is nothing to send (or the cache is off).
  bool TakeEvents(proto::CacheEvents* out);
  void RequestSnapshot() { snapshot_due_ = true; }

  // PGDSF's cost of caching `tokens` tokens after a prefix of `prefix`:
  // seconds with a cost profile, FLOPs without (0 when off).
  double Cost(int64_t prefix, int64_t tokens) const { return cost_ ? cost_(prefix, tokens) : 0; }

 private:
  PrefixCache() = default;

  engine::BlockPool* pool_ = nullptr;
  kvcache::Policy policy_ = kvcache::Policy::kPgdsf;
  std::function<double(int64_t, int64_t)> cost_;
  std::unique_ptr<PoolBlockStore> store_;
  std::unique_ptr<kvcache::PrefixTree> tree_;  // After store_: releases into it.
  // Per tier (device, host): with the cache on, the device tier is asked
  // for every prompt token and the host tier for those the device lacked.
  Counter* query_[2] = {nullptr, nullptr};
  Counter* hits_[2] = {nullptr, nullptr};
  Gauge* usage_[2] = {nullptr, nullptr};
  Counter* swap_bytes_[2] = {nullptr, nullptr};  // to host, to device
  Counter* evictions_[3] = {nullptr, nullptr, nullptr};  // device to host, device dropped, host
  int64_t published_query_ = 0, published_hits_[2] = {0, 0};
  // Block hashes the tree holds, and those whose presence changed since the
  // last events (true: now held).
  std::unordered_set<uint64_t> held_;
  std::unordered_map<uint64_t, bool> changed_;
  uint64_t events_seq_ = 0;
  bool snapshot_due_ = false;
  uint64_t published_swap_[2] = {0, 0};
  int64_t published_evictions_[3] = {0, 0, 0};
};

}  // namespace duet::worker

#endif  // DUET_WORKER_PREFIX_CACHE_H_

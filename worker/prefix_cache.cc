#include "worker/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "placement/latency.h"
#include "placement/model.h"

namespace duet::worker {

absl::StatusOr<std::unique_ptr<PrefixCache>> PrefixCache::Create(const PrefixCacheOptions& o,
                                                                  engine::BlockPool* pool,
                                                                  const std::string& model_dir,
                                                                  const spec::ModelConfig& c) {
  if (o.host_blocks < 0 || o.host_memory_bytes < 0) {
    return absl::InvalidArgumentError("the host KV tier's size must be >= 0");
  }
  if (!o.enabled && (o.host_blocks > 0 || o.host_memory_bytes > 0 || !o.cost_profile.empty())) {
    return absl::InvalidArgumentError("a host KV tier or a cost profile needs the prefix cache on");
  }
  std::unique_ptr<PrefixCache> cache(new PrefixCache());
  cache->pool_ = pool;
  cache->policy_ = o.policy;
  MetricsRegistry& m = MetricsRegistry::Default();
  for (int t = 0; t < 2; ++t) {
    const Labels tier = {{"tier", t == 0 ? "device" : "host"}};
    cache->query_[t] = m.GetCounter("duet_prefix_cache_query_tokens_total",
                                    "Prompt tokens looked up in the prefix cache", tier);
    cache->hits_[t] = m.GetCounter("duet_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache",
                                   tier);
    cache->usage_[t] =
        m.GetGauge("duet_prefix_cache_usage_ratio", "Fraction of the tier's blocks the prefix cache holds", tier);
    cache->swap_bytes_[t] = m.GetCounter("duet_prefix_cache_swap_bytes_total",
                                         "KV bytes copied between the prefix cache's tiers",
                                         {{"direction", t == 0 ? "to_host" : "to_device"}});
  }
  const Labels eviction_labels[3] = {{{"tier", "device"}, {"reason", "to_host"}},
                                     {{"tier", "device"}, {"reason", "dropped"}},
                                     {{"tier", "host"}, {"reason", "capacity"}}};
  for (int k = 0; k < 3; ++k) {
    cache->evictions_[k] = m.GetCounter("duet_prefix_cache_evictions_total", "KV blocks the prefix cache evicted",
                                        eviction_labels[k]);
  }
  if (!o.enabled) return cache;

  std::function<double(int64_t, int64_t)>& cost = cache->cost_;
  if (!o.cost_profile.empty()) {
    ASSIGN_OR_RETURN(placement::ModelSpec spec, placement::ModelFromConfig(model_dir));
    absl::StatusOr<std::unique_ptr<placement::LatencyModel>> lat = placement::LoadLatencyModel(o.cost_profile, spec);
    if (!lat.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prefix cache's cost profile ", o.cost_profile, ": ", lat.status().message()));
    }
    std::shared_ptr<placement::LatencyModel> model = std::move(*lat);
    cost = [model](int64_t prefix, int64_t tokens) {
      return placement::PrefillSavedSeconds(*model, {}, prefix, tokens);
    };
  } else {
    const double h = static_cast<double>(c.hidden_size), layers = static_cast<double>(c.num_layers);
    cost = [h, layers](int64_t prefix, int64_t tokens) {
      const double n = static_cast<double>(tokens);
      return n * layers * (24 * h * h + 4 * h * (static_cast<double>(prefix) + n / 2));
    };
  }
  const int64_t host = o.host_blocks > 0 ? o.host_blocks : o.host_memory_bytes / pool->block_bytes();
  cache->store_ = std::make_unique<PoolBlockStore>(pool, host);
  PrefixCache* self = cache.get();
  cache->tree_ = std::make_unique<kvcache::PrefixTree>(
      kvcache::TreeOptions{.block_size = pool->layout().block_size,
                           .policy = o.policy,
                           .host_tier = host > 0,
                           .cost = cost,
                           .on_change =
                               [self](absl::Span<const uint64_t> hashes, bool added) {
                                 for (uint64_t h : hashes) {
                                   if (added) {
                                     self->held_.insert(h);
                                   } else {
                                     self->held_.erase(h);
                                   }
                                   self->changed_[h] = added;
                                 }
                               }},
      cache->store_.get());
  return cache;
}

// The tree first, explicitly: its destructor reports every node it drops
// to on_change, which writes held_ and changed_ (declared after it, so
// otherwise gone by then).
PrefixCache::~PrefixCache() { tree_.reset(); }

int64_t PrefixCache::device_blocks() const { return tree_ ? tree_->blocks(kvcache::Tier::kDevice) : 0; }

int64_t PrefixCache::AvailableBlocks() const {
  return pool_->num_free() + (store_ ? store_->CacheOnlyBlocks() : 0);
}

int64_t PrefixCache::Reset() {
  if (tree_ == nullptr) return 0;
  auto held = [this] { return tree_->blocks(kvcache::Tier::kDevice) + tree_->blocks(kvcache::Tier::kHost); };
  const int64_t before = held();
  tree_->Clear();
  return before - held();
}

void PrefixCache::Publish(int64_t query, int64_t hit_device, int64_t hit_host) {
  query_[0]->Increment(static_cast<double>(query - published_query_));
  query_[1]->Increment(static_cast<double>((query - hit_device) - (published_query_ - published_hits_[0])));
  hits_[0]->Increment(static_cast<double>(hit_device - published_hits_[0]));
  hits_[1]->Increment(static_cast<double>(hit_host - published_hits_[1]));
  published_query_ = query;
  published_hits_[0] = hit_device;
  published_hits_[1] = hit_host;
  if (tree_ == nullptr) return;
  usage_[0]->Set(static_cast<double>(tree_->blocks(kvcache::Tier::kDevice)) / static_cast<double>(pool_->num_blocks()));
  usage_[1]->Set(store_->host_slots() > 0 ? static_cast<double>(tree_->blocks(kvcache::Tier::kHost)) /
                                                static_cast<double>(store_->host_slots())
                                          : 0.0);
  const uint64_t swapped[2] = {store_->bytes_to_host(), store_->bytes_to_device()};
  const kvcache::PrefixTree::Stats& st = tree_->stats();
  const int64_t evicted[3] = {st.evicted_blocks[0] - st.dropped_blocks, st.dropped_blocks, st.evicted_blocks[1]};
  for (int t = 0; t < 2; ++t) {
    swap_bytes_[t]->Increment(static_cast<double>(swapped[t] - published_swap_[t]));
    published_swap_[t] = swapped[t];
  }
  for (int k = 0; k < 3; ++k) {
    evictions_[k]->Increment(static_cast<double>(evicted[k] - published_evictions_[k]));
    published_evictions_[k] = evicted[k];
  }
}

bool PrefixCache::TakeEvents(proto::CacheEvents* out) {
  if (tree_ == nullptr || (!snapshot_due_ && changed_.empty())) return false;
  out->Clear();
  out->set_seq(++events_seq_);
  out->set_block_size(static_cast<int32_t>(pool_->layout().block_size));
  if (snapshot_due_) {
    out->set_snapshot(true);
    for (uint64_t h : held_) out->add_added(h);
  } else {
    for (const auto& [h, now_held] : changed_) {
      if (now_held) {
        out->add_added(h);
      } else {
        out->add_removed(h);
      }
    }
  }
  snapshot_due_ = false;
  changed_.clear();
  return true;
}

std::string PrefixCache::Summary() const {
  if (tree_ == nullptr) return "prefix cache off";
  const kvcache::PrefixTree::Stats& st = tree_->stats();
  return absl::StrCat("prefix cache (", kvcache::PolicyName(policy_), ") evicted ", st.evicted_blocks[0],
                      " device and ", st.evicted_blocks[1], " host blocks, swapped ", st.swap_out_blocks, " out and ",
                      st.swap_in_blocks, " in, dropped ", st.dropped_blocks);
}

}  // namespace duet::worker

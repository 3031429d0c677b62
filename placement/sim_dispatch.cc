#include "placement/sim_dispatch.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "base/logging.h"

namespace duet::placement {
SimDispatch::SimDispatch(const std::string& policy, CacheAwareWeights weights) {
  absl::StatusOr<dispatch::DispatchPolicy> p = dispatch::ParseDispatchPolicy(policy);
  CHECK(p.ok()) << p.status();
  absl::StatusOr<std::unique_ptr<dispatch::Dispatcher>> d = dispatch::NewDispatcher(
      *p, {.cache = &view_, .uncached_weight = weights.uncached, .queued_weight = weights.queued});
  CHECK(d.ok()) << d.status();
  dispatcher_ = std::move(*d);
}

const std::vector<dispatch::WorkerLoad>& SimDispatch::Loads(absl::Span<const InstanceLoad> instances) {
  if (loads_.size() != instances.size()) {
    loads_.assign(instances.size(), {});
    for (size_t i = 0; i < instances.size(); ++i) loads_[i].id = absl::StrFormat("%09d", i);
  }
  bool any_decode = false;
  for (const InstanceLoad& s : instances) any_decode |= s.role == InstanceRole::kDecode;
  for (size_t i = 0; i < instances.size(); ++i) {
    const InstanceLoad& s = instances[i];
    dispatch::WorkerLoad& w = loads_[i];
    w.role = dispatch::Role::kColocated;
    if (s.role == InstanceRole::kDecode) w.role = dispatch::Role::kDecode;
    if (s.role == InstanceRole::kPrefill && any_decode) w.role = dispatch::Role::kPrefill;
    w.queued_prefill_tokens = s.charged_tokens;
    w.kv_blocks_free = std::isfinite(s.kv_cap) ? static_cast<int64_t>(std::floor(s.kv_cap - s.kv_used))
                                               : std::numeric_limits<int64_t>::max();
    w.running_requests = s.requests;
  }
  return loads_;
}

SimDispatch::Pick SimDispatch::PickPrefill(absl::Span<const InstanceLoad> instances,
                                           absl::Span<const int32_t> prompt, int64_t num_tokens) {
  view_.instances = instances;
  absl::StatusOr<dispatch::PrefillPick> p =
      dispatch::PickPrefill(*dispatcher_, Loads(instances), {.prompt = prompt, .num_tokens = num_tokens});
  view_.instances = {};
  CHECK(p.ok()) << p.status();
  return Pick{.instance = IndexOf(p->worker), .charged = p->prefill_tokens >= 0 ? p->prefill_tokens : num_tokens};
}

int32_t SimDispatch::PickDecode(absl::Span<const InstanceLoad> instances) {
  const dispatch::WorkerLoad* d = dispatch::PickDecode(*dispatcher_, Loads(instances));
  CHECK(d != nullptr) << "no decode instance";
  return IndexOf(d);
}

std::vector<int64_t> SimDispatch::TreeView::CachedTokens(absl::Span<const dispatch::WorkerLoad* const> workers,
                                                         absl::Span<const int32_t> prompt) const {
  std::vector<int64_t> out;
  out.reserve(workers.size());
  for (const dispatch::WorkerLoad* w : workers) {
    kvcache::PrefixTree* tree = instances[static_cast<size_t>(owner_->IndexOf(w))].tree;
    // The last token is always computed, as the router's index leaves it.
    out.push_back(tree != nullptr && !prompt.empty() ? tree->Lookup(prompt.subspan(0, prompt.size() - 1)).tokens : 0);
  }
  return out;
}

}  // namespace duet::placement

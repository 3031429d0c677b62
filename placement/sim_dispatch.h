// The simulator's side of dispatch: its instances as the router sees its
// workers and its prefix trees as cache_aware's view, so `duet sim` picks
// with the router's own policies and formulas (dispatch/).
//
//   SimDispatch d("cache_aware", weights);
//   SimDispatch::Pick p = d.PickPrefill(instances, prompt_tokens, prompt_len);
//   int32_t decode = d.PickDecode(instances);   // when the prefill is done
//
// An instance's queue is the router's book: the tokens dispatch charged
// each request sent to it (cache_aware: those its tree lacks; else the
// whole prompt), until the request's first token. Loads are exact at each
// pick: the heartbeat's lag (up to 500 ms in a real cluster) is not
// modelled. Without decode instances a prefill instance ends each request
// at its first token, and dispatch sees it as colocated (the router never
// picks a dedicated prefill while no decode is live). Not thread-safe.
#ifndef DUET_PLACEMENT_SIM_DISPATCH_H_
#define DUET_PLACEMENT_SIM_DISPATCH_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "base/serving_defaults.h"
#include "dispatch/dispatch.h"
#include "kvcache/prefix_tree.h"
#include "placement/sim.h"

namespace duet::placement {

// One instance as dispatch needs it.
struct InstanceLoad {
  InstanceRole role = InstanceRole::kColocated;
  int64_t charged_tokens = 0;  // the router's book
  double kv_used = 0;          // KV tokens held
  double kv_cap = std::numeric_limits<double>::infinity();
  int64_t requests = 0;               // decode or colocated: admitted, pulling, running or waiting
  kvcache::PrefixTree* tree = nullptr;  // a prefill instance's cache; not owned
};

class SimDispatch {
 public:
  // CHECK-fails on a policy ParseDispatchPolicy refuses or negative weights
  // (duet sim and the cluster file's reader refuse those first).
  SimDispatch(const std::string& policy, CacheAwareWeights weights);

  struct Pick {
    int32_t instance = -1;
    int64_t charged = 0;  // tokens to charge its queue until the first token
  };
  // The prefill (or colocated) instance for a request of `num_tokens`
  // tokens whose ids are `prompt` (empty when the workload has none).
  // Needs at least one prefill or colocated instance.
  Pick PickPrefill(absl::Span<const InstanceLoad> instances, absl::Span<const int32_t> prompt,
                   int64_t num_tokens);
  // The decode instance for a request whose prefill is done. Needs one.
  int32_t PickDecode(absl::Span<const InstanceLoad> instances);

  // The instances as the router would see them, ids in index order: the
  // snapshot a pick reads, kept between picks so that only the loads change.
  const std::vector<dispatch::WorkerLoad>& Loads(absl::Span<const InstanceLoad> instances);

 private:
  int32_t IndexOf(const dispatch::WorkerLoad* w) const { return static_cast<int32_t>(w - loads_.data()); }

  // cache_aware's view: the instances' own trees.
  class TreeView : public dispatch::CacheView {
   public:
    explicit TreeView(const SimDispatch* owner) : owner_(owner) {}
    std::vector<int64_t> CachedTokens(absl::Span<const dispatch::WorkerLoad* const> workers,
                                      absl::Span<const int32_t> prompt) const override;
    absl::Span<const InstanceLoad> instances;  // of the pick in progress

   private:
    const SimDispatch* const owner_;
  };

  std::vector<dispatch::WorkerLoad> loads_;
  TreeView view_{this};
  std::unique_ptr<dispatch::Dispatcher> dispatcher_;
};

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_SIM_DISPATCH_H_

// cache_aware: the prefill whose cache (by the CacheView) lacks the fewest of
// the request's tokens, weighed against its queue (dispatch.h).
#include "dispatch/dispatch.h"

namespace duet::dispatch {
namespace {

class CacheAware : public Dispatcher {
 public:
  CacheAware(const CacheView* cache, double uncached_weight, double queued_weight)
      : cache_(cache), uncached_weight_(uncached_weight), queued_weight_(queued_weight) {}

  PrefillPick PickPrefill(const Candidates& c, const DispatchRequest& request) override {
    const double tokens = static_cast<double>(request.tokens());
    const std::vector<int64_t> cached = cache_->CachedTokens(c.prefill, request.prompt);
    const WorkerLoad* best = nullptr;
    double best_score = 0, best_uncached = 0;
    for (size_t i = 0; i < c.prefill.size(); ++i) {  // in id order: the first of equal scores wins
      const WorkerLoad* w = c.prefill[i];
      const double uncached = tokens - static_cast<double>(cached[i]);
      const double score =
          uncached_weight_ * uncached + queued_weight_ * static_cast<double>(w->queued_prefill_tokens);
      // Equal scores: as least_loaded.
      if (best == nullptr || score < best_score || (score == best_score && FewerQueued(w, best))) {
        best = w;
        best_score = score;
        best_uncached = uncached;
      }
    }
    return PrefillPick{.worker = best, .prefill_tokens = static_cast<int64_t>(best_uncached)};
  }
  const WorkerLoad* PickDecode(const Candidates& c) override { return LeastLoadedDecode(c); }

 private:
  const CacheView* const cache_;
  const double uncached_weight_, queued_weight_;
};

}  // namespace

std::unique_ptr<Dispatcher> NewCacheAwareDispatcher(const CacheView* cache, double uncached_weight,
                                                    double queued_weight) {
  return std::make_unique<CacheAware>(cache, uncached_weight, queued_weight);
}

}  // namespace duet::dispatch

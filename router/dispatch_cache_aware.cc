// cache_aware: the prefill whose cache (by the router's CacheIndex) lacks the
// fewest of the request's tokens, weighed against its queue (dispatch.h).
#include "router/dispatch.h"

namespace duet::router {
namespace {

class CacheAware : public Dispatcher {
 public:
  CacheAware(const CacheIndex* index, double uncached_weight, double queued_weight)
      : index_(index), uncached_weight_(uncached_weight), queued_weight_(queued_weight) {}

  absl::StatusOr<Assignment> Pick(absl::Span<const WorkerLoad> workers, const DispatchRequest& request) override {
    const Candidates c = SplitCandidates(workers);
    if (c.prefill.empty()) return MissingRole(workers);
    const double tokens = static_cast<double>(request.prompt.size());
    const WorkerLoad* best = nullptr;
    double best_score = 0, best_uncached = 0;
    CacheIndex::PromptHashes hashes;  // the prompt's, computed once per block size
    for (const WorkerLoad* w : c.prefill) {  // in id order: the first of equal scores wins
      const double uncached = tokens - static_cast<double>(index_->CachedTokens(w->id, request.prompt, &hashes));
      const double score =
          uncached_weight_ * uncached + queued_weight_ * static_cast<double>(w->queued_prefill_tokens);
      // Equal scores: the shorter queue, as least_loaded.
      if (best == nullptr || score < best_score ||
          (score == best_score && w->queued_prefill_tokens < best->queued_prefill_tokens)) {
        best = w;
        best_score = score;
        best_uncached = uncached;
      }
    }
    Assignment a = Assign(*best, LeastLoadedDecode(c));
    a.prefill_tokens = static_cast<int64_t>(best_uncached);
    return a;
  }

 private:
  const CacheIndex* const index_;
  const double uncached_weight_, queued_weight_;
};

}  // namespace

std::unique_ptr<Dispatcher> NewCacheAwareDispatcher(const CacheIndex* index, double uncached_weight,
                                                    double queued_weight) {
  return std::make_unique<CacheAware>(index, uncached_weight, queued_weight);
}

}  // namespace duet::router

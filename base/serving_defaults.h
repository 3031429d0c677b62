// Defaults that the serving processes and the planner must agree on, in one
// place: a worker, `duet sim`, `duet place` and cluster files all start from
// these, so a plan simulates the engine the workers run.
//
//   int64_t budget = flags.IsSet("max-batch-tokens") ? ... : kDefaultMaxBatchTokens;
#ifndef DUET_BASE_SERVING_DEFAULTS_H_
#define DUET_BASE_SERVING_DEFAULTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet {

// Prompt tokens one engine step (one prefill batch) may hold.
inline constexpr int64_t kDefaultMaxBatchTokens = 2048;

// cache_aware dispatch, in the router and in duet sim: a prefill's score is
// uncached x the prompt tokens its cache lacks + queued x its queued prefill
// tokens, and the lowest wins. Queued tokens weigh a quarter: at 1 (the
// score is then the request's own time to first token) a busy worker's
// documents are computed again on an idle one, and two caches hold the same
// documents (duet sim of the RAG bench's workload, 1,000 requests on two
// prefills of 302 + 909 blocks at 0.7-1.5 requests/s: 29-30% of document
// tokens reused at 1, 32% at 0.25, 26-27% under least_loaded, TTFT p50/p90
// within 5% of weight 1's; on the bench's real clusters cache_aware matches
// one cache of both halves' size: +4.7 to +6.6 pp over least_loaded, TTFT
// p90 0.74-0.98x least_loaded's in four side-by-side runs once the router
// kept its own book of the queues, router/registry.h).
struct CacheAwareWeights {
  double uncached = 1.0;
  double queued = 0.25;
  std::string ToString() const;  // "U,Q", as the flag takes it
};
// "U,Q" (--cache-aware-weights), both >= 0.
absl::StatusOr<CacheAwareWeights> ParseCacheAwareWeights(absl::string_view text);

}  // namespace duet

#endif  // DUET_BASE_SERVING_DEFAULTS_H_

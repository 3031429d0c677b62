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
// tokens, and the lowest wins. Queued tokens weigh a fifth: at 1 (the score
// is then the request's own time to first token) a busy worker's documents
// are computed again on an idle one, and two caches hold the same documents
// (duet sim of the RAG bench's workload, 1,000 requests on two prefills of
// 302 + 909 blocks at 0.7-2.5 requests/s: 29-30.5% of document tokens reused
// at 1, 31-32.4% at 0.15-0.25, 26-27% under least_loaded, TTFT p50/p90
// within 3% of weight 1's). On the bench's real clusters, side by side with
// least_loaded, the weight trades hits for TTFT p90 under load: 31.0% at
// 0.25 (+4.7 to +6.6 pp over least_loaded in four runs, p90 0.74-0.98x), at
// 0.2 31.2-32.1% (+4.2 to +6.0 pp in six runs, p90 0.53-0.98x), at 0.15
// 32.1% (+5.7 pp, p90 1.08x); one prefill holding both halves' cache reuses
// 32%, the most the routing can recover.
struct CacheAwareWeights {
  double uncached = 1.0;
  double queued = 0.2;
  std::string ToString() const;  // "U,Q", as the flag takes it
};
// "U,Q" (--cache-aware-weights), both >= 0.
absl::StatusOr<CacheAwareWeights> ParseCacheAwareWeights(absl::string_view text);

}  // namespace duet

#endif  // DUET_BASE_SERVING_DEFAULTS_H_

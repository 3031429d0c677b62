// Defaults that the serving processes and the planner must agree on, in one
// place: a worker, `duet sim`, `duet place` and cluster files all start from
// these, so a plan simulates the engine the workers run.
//
//   int64_t budget = flags.IsSet("max-batch-tokens") ? ... : kDefaultMaxBatchTokens;
#ifndef DUET_BASE_SERVING_DEFAULTS_H_
#define DUET_BASE_SERVING_DEFAULTS_H_

#include <cstdint>

namespace duet {

// Prompt tokens one engine step (one prefill batch) may hold.
inline constexpr int64_t kDefaultMaxBatchTokens = 2048;

}  // namespace duet

#endif  // DUET_BASE_SERVING_DEFAULTS_H_

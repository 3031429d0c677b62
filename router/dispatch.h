// Dispatch policies: which prefill and which decode worker get a request.
// Each is a Dispatcher, a function of the live workers' loads (and, for
// cache_aware, the router's CacheIndex and the request's tokens), so it is
// unit-tested on recorded snapshots without a network.
//
//   ASSIGN_OR_RETURN(auto d, NewDispatcher(DispatchPolicy::kCacheAware, {.index = &index}));
//   ASSIGN_OR_RETURN(Assignment a, d->Pick(registry.LiveLoads(), {.prompt = tokens}));
//
// least_loaded (the default; dispatch_least_loaded.cc): prefill = fewest
// queued prefill tokens (the tokens of the prefills the router sent it that
// have not yet produced their first token, so a burst spreads out).
// round_robin (dispatch_round_robin.cc): cycles over the candidates in id
// order, loads ignored (a baseline). cache_aware (dispatch_cache_aware.cc):
// prefill = least uncached_weight x (prompt tokens the worker's cache lacks,
// by the index) + queued_weight x queued prefill tokens, so a request goes
// where its prefix is unless that worker's queue costs more than the prefix
// saves; with nothing cached anywhere it is least_loaded. Every policy but
// round_robin picks the decode with the most free KV blocks, then the fewest
// running requests. A colocated worker serves both phases: when it is picked
// as prefill it is also the decode. Dedicated prefill workers are
// candidates only while some decode worker is live. Ties break by id, so a
// pick is deterministic. Not thread-safe (the router calls it under its lock).
#ifndef DUET_ROUTER_DISPATCH_H_
#define DUET_ROUTER_DISPATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/control.pb.h"
#include "router/cache_index.h"

namespace duet::router {

enum class DispatchPolicy { kLeastLoaded, kRoundRobin, kCacheAware };

// "least_loaded", "round_robin" or "cache_aware"; InvalidArgument otherwise.
absl::StatusOr<DispatchPolicy> ParseDispatchPolicy(absl::string_view name);
absl::string_view DispatchPolicyName(DispatchPolicy policy);

// One live worker as dispatch sees it: router-side estimates, not raw stats.
struct WorkerLoad {
  std::string id;
  proto::Role role = proto::ROLE_UNSPECIFIED;
  std::string control_address;
  int64_t queued_prefill_tokens = 0;  // Tokens of its unfinished prefills, as charged.
  int64_t kv_blocks_free = 0;         // Heartbeat's free blocks - blocks assigned since.
  int64_t running_requests = 0;       // Heartbeat's running + requests assigned since.
};

// What a policy may look at of the request: the tokens to prefill (prompt,
// then any resumed tokens).
struct DispatchRequest {
  absl::Span<const int32_t> prompt;
};

struct Assignment {
  std::string prefill_id;
  std::string decode_id;  // == prefill_id for a colocated worker.
  std::string decode_address;
  // The tokens the prefill will compute, as the policy sees it (cache_aware:
  // those its cache lacks; -1: the whole prompt), charged to its queue until
  // its next stats.
  int64_t prefill_tokens = -1;
};

// Whether `workers` can serve a request at all: a colocated worker, or a
// prefill and a decode worker. Otherwise Unavailable naming what is missing.
absl::Status CanServe(absl::Span<const WorkerLoad> workers);

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  // Unavailable (naming the missing role) when CanServe fails.
  virtual absl::StatusOr<Assignment> Pick(absl::Span<const WorkerLoad> workers, const DispatchRequest& request) = 0;
};

struct DispatchOptions {
  // cache_aware: the router's index (not owned; outlives the dispatcher) and
  // the weights of uncached prompt tokens and of queued prefill tokens.
  const CacheIndex* index = nullptr;
  double uncached_weight = 1;
  double queued_weight = 1;
};
// InvalidArgument for cache_aware without an index or with negative weights.
absl::StatusOr<std::unique_ptr<Dispatcher>> NewDispatcher(DispatchPolicy policy, DispatchOptions options = {});

// What the policies share (dispatch.cc).
struct Candidates {
  std::vector<const WorkerLoad*> prefill;  // Prefill and colocated workers, by id.
  std::vector<const WorkerLoad*> decode;   // Decode workers only, by id.
};
Candidates SplitCandidates(absl::Span<const WorkerLoad> workers);
// The Unavailable error for workers that cannot serve.
absl::Status MissingRole(absl::Span<const WorkerLoad> workers);
// The decode with the most free blocks, then the fewest running requests.
const WorkerLoad* LeastLoadedDecode(const Candidates& c);
// The assignment of `prefill` (and `decode`, unless the prefill is colocated).
Assignment Assign(const WorkerLoad& prefill, const WorkerLoad* decode);

std::unique_ptr<Dispatcher> NewLeastLoadedDispatcher();
std::unique_ptr<Dispatcher> NewRoundRobinDispatcher();
std::unique_ptr<Dispatcher> NewCacheAwareDispatcher(const CacheIndex* index, double uncached_weight,
                                                    double queued_weight);

}  // namespace duet::router

#endif  // DUET_ROUTER_DISPATCH_H_

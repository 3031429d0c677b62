// Dispatch policies: which prefill and which decode worker get a request,
// decided the same way by the router (router/) and by the simulator
// (placement/sim.cc, `duet sim`). Each policy is a Dispatcher, a function of
// the workers' loads (and, for cache_aware, a CacheView of their caches and
// the request's tokens), so it is unit-tested on snapshots without a network.
//
//   ASSIGN_OR_RETURN(auto d, NewDispatcher(DispatchPolicy::kCacheAware, {.cache = &view}));
//   ASSIGN_OR_RETURN(Assignment a, Pick(*d, loads, {.prompt = tokens}));
//
// least_loaded (the default; least_loaded.cc): prefill = fewest queued
// prefill tokens (the tokens of the prefills sent to it that have not yet
// produced their first token, so a burst spreads out), then fewest running
// requests. round_robin
// (round_robin.cc): cycles over the candidates in id order, loads ignored
// (a baseline). cache_aware (cache_aware.cc): prefill = least
// uncached_weight x (prompt tokens the worker's cache lacks, by the view) +
// queued_weight x queued prefill tokens, so a request goes where its prefix
// is unless that worker's queue costs more than the prefix saves; with
// nothing cached anywhere it is least_loaded. Every policy but round_robin
// picks the decode with the most free KV blocks, then the fewest running
// requests. A colocated worker serves both phases: when it is picked as
// prefill it is also the decode. Dedicated prefill workers are candidates
// only while some decode worker is live. Ties break by id, so a pick is
// deterministic.
//
// The router picks both workers when a request arrives (Pick); the
// simulator picks the prefill then and the decode when the prefill is done
// (PickPrefill, PickDecode). Depends on base only. Not thread-safe: a
// dispatcher is its caller's (the router calls it under its lock).
#ifndef DUET_DISPATCH_DISPATCH_H_
#define DUET_DISPATCH_DISPATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace duet::dispatch {

enum class DispatchPolicy { kLeastLoaded, kRoundRobin, kCacheAware };

// "least_loaded", "round_robin" or "cache_aware"; InvalidArgument otherwise.
absl::StatusOr<DispatchPolicy> ParseDispatchPolicy(absl::string_view name);
absl::string_view DispatchPolicyName(DispatchPolicy policy);

enum class Role { kPrefill, kDecode, kColocated };

// One live worker as dispatch sees it: the caller's estimates, not raw stats.
struct WorkerLoad {
  std::string id;
  Role role = Role::kPrefill;
  std::string control_address;
  int64_t queued_prefill_tokens = 0;  // Tokens of its unfinished prefills, as charged.
  int64_t kv_blocks_free = 0;         // The router: heartbeat's free blocks - blocks assigned since.
  int64_t running_requests = 0;       // The router: heartbeat's running + requests assigned since.
};

// What a policy may look at of the request: the tokens to prefill (prompt,
// then any resumed tokens). `num_tokens` -1 is prompt.size(); the simulator
// gives a count alone for a prompt whose tokens it does not generate.
struct DispatchRequest {
  absl::Span<const int32_t> prompt;
  int64_t num_tokens = -1;
  int64_t tokens() const { return num_tokens >= 0 ? num_tokens : static_cast<int64_t>(prompt.size()); }
};

// What cache_aware knows of the workers' caches: the router's CacheIndex
// (built from the workers' cache events), or the simulator's own trees.
class CacheView {
 public:
  virtual ~CacheView() = default;
  // For each of `workers`, in order, the leading tokens of `prompt` its
  // cache holds (0 when unknown).
  virtual std::vector<int64_t> CachedTokens(absl::Span<const WorkerLoad* const> workers,
                                            absl::Span<const int32_t> prompt) const = 0;
};

// A prefill (or colocated) worker picked, and the tokens it will compute
// as the policy sees it (cache_aware: those its cache lacks; -1: the whole
// prompt), which the caller charges to its queue until its first token.
struct PrefillPick {
  const WorkerLoad* worker = nullptr;
  int64_t prefill_tokens = -1;
};

struct Assignment {
  std::string prefill_id;
  std::string decode_id;  // == prefill_id for a colocated worker.
  std::string decode_address;
  int64_t prefill_tokens = -1;  // As PrefillPick's.
};

// Whether `workers` can serve a request at all: a colocated worker, or a
// prefill and a decode worker. Otherwise Unavailable naming what is missing.
absl::Status CanServe(absl::Span<const WorkerLoad> workers);

// The workers a policy chooses among, split once per pick.
struct Candidates {
  std::vector<const WorkerLoad*> prefill;  // Prefill and colocated workers, by id.
  std::vector<const WorkerLoad*> decode;   // Decode workers only, by id.
};

// A policy. Callers go through PickPrefill, PickDecode and Pick below,
// which split the workers and check them once.
class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  // One of c.prefill, which is not empty.
  virtual PrefillPick PickPrefill(const Candidates& c, const DispatchRequest& request) = 0;
  // One of c.decode, which is not empty.
  virtual const WorkerLoad* PickDecode(const Candidates& c) = 0;
};

// The prefill (or colocated) worker for `request`; Unavailable (naming the
// missing role) when CanServe fails.
absl::StatusOr<PrefillPick> PickPrefill(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers,
                                        const DispatchRequest& request);
// The decode worker among `workers` (others are ignored) for a request
// whose prefill was a dedicated prefill worker; nullptr when none is live.
const WorkerLoad* PickDecode(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers);
// Both at once, as the router assigns them: the prefill, then (unless it
// is colocated) the decode.
absl::StatusOr<Assignment> Pick(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers,
                                const DispatchRequest& request);

struct DispatchOptions {
  // cache_aware: the caches' view (not owned; outlives the dispatcher) and
  // the weights of uncached prompt tokens and of queued prefill tokens.
  const CacheView* cache = nullptr;
  double uncached_weight = 1;
  double queued_weight = 1;
};
// InvalidArgument for cache_aware without a cache view or with negative weights.
absl::StatusOr<std::unique_ptr<Dispatcher>> NewDispatcher(DispatchPolicy policy, DispatchOptions options = {});

// What the policies share (dispatch.cc).
Candidates SplitCandidates(absl::Span<const WorkerLoad> workers);
// The Unavailable error for workers that cannot serve.
absl::Status MissingRole(absl::Span<const WorkerLoad> workers);
// The decode with the most free blocks, then the fewest running requests;
// c.decode is not empty.
const WorkerLoad* LeastLoadedDecode(const Candidates& c);
// least_loaded's prefill order: fewer queued prefill tokens, then fewer
// running requests (a colocated worker's decodes: with every prefill queue
// empty, as under a steady load it mostly is, ties by id alone would send
// every request to the first worker).
bool FewerQueued(const WorkerLoad* a, const WorkerLoad* b);

std::unique_ptr<Dispatcher> NewLeastLoadedDispatcher();
std::unique_ptr<Dispatcher> NewRoundRobinDispatcher();
std::unique_ptr<Dispatcher> NewCacheAwareDispatcher(const CacheView* cache, double uncached_weight,
                                                    double queued_weight);

}  // namespace duet::dispatch

#endif  // DUET_DISPATCH_DISPATCH_H_

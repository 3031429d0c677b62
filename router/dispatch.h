// Dispatch policies: which prefill and which decode worker get a request.
// Pure functions of the live workers' loads, so they are unit-tested without
// a network and replayable in the simulator's terms.
//
//   Dispatcher d(DispatchPolicy::kLeastLoaded);
//   ASSIGN_OR_RETURN(Assignment a, d.Pick(registry.LiveLoads()));
//
// Least-loaded (the default): prefill = fewest queued prefill tokens (the
// last heartbeat's queue plus the tokens the router assigned since, so a
// burst between heartbeats spreads out); decode = most free KV blocks, then
// fewest running requests. A colocated worker serves both phases: when it is
// picked as prefill it is also the decode. Dedicated prefill workers are
// candidates only while some decode worker is live. Round-robin cycles over
// the candidates in id order (a baseline for comparison). Ties break by id,
// so a pick is deterministic. A Dispatcher is not thread-safe (the router
// calls it under its lock).
#ifndef DUET_ROUTER_DISPATCH_H_
#define DUET_ROUTER_DISPATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/control.pb.h"

namespace duet::router {

enum class DispatchPolicy { kLeastLoaded, kRoundRobin };

// "least_loaded" or "round_robin"; InvalidArgument otherwise.
absl::StatusOr<DispatchPolicy> ParseDispatchPolicy(absl::string_view name);
absl::string_view DispatchPolicyName(DispatchPolicy policy);

// One live worker as dispatch sees it: router-side estimates, not raw stats.
struct WorkerLoad {
  std::string id;
  proto::Role role = proto::ROLE_UNSPECIFIED;
  std::string control_address;
  int64_t queued_prefill_tokens = 0;  // Heartbeat's queue + tokens assigned since.
  int64_t kv_blocks_free = 0;         // Heartbeat's free blocks - blocks assigned since.
  int64_t running_requests = 0;       // Heartbeat's running + requests assigned since.
};

struct Assignment {
  std::string prefill_id;
  std::string decode_id;  // == prefill_id for a colocated worker.
  std::string decode_address;
};

// Whether `workers` can serve a request at all: a colocated worker, or a
// prefill and a decode worker. Otherwise Unavailable naming what is missing.
absl::Status CanServe(absl::Span<const WorkerLoad> workers);

class Dispatcher {
 public:
  explicit Dispatcher(DispatchPolicy policy) : policy_(policy) {}

  // Unavailable (naming the missing role) when CanServe fails.
  absl::StatusOr<Assignment> Pick(absl::Span<const WorkerLoad> workers);

  DispatchPolicy policy() const { return policy_; }

 private:
  DispatchPolicy policy_;
  uint64_t next_prefill_ = 0;  // Round-robin cursors.
  uint64_t next_decode_ = 0;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_DISPATCH_H_

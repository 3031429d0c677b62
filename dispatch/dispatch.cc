#include "dispatch/dispatch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::dispatch {

absl::StatusOr<DispatchPolicy> ParseDispatchPolicy(absl::string_view name) {
  if (name == "least_loaded") return DispatchPolicy::kLeastLoaded;
  if (name == "round_robin") return DispatchPolicy::kRoundRobin;
  if (name == "cache_aware") return DispatchPolicy::kCacheAware;
  return absl::InvalidArgumentError(
      absl::StrCat("--policy must be least_loaded, round_robin or cache_aware, got \"", name, "\""));
}

absl::string_view DispatchPolicyName(DispatchPolicy policy) {
  switch (policy) {
    case DispatchPolicy::kRoundRobin: return "round_robin";
    case DispatchPolicy::kCacheAware: return "cache_aware";
    case DispatchPolicy::kLeastLoaded: break;
  }
  return "least_loaded";
}

Candidates SplitCandidates(absl::Span<const WorkerLoad> workers) {
  // A dedicated prefill is useless without a decode to hand its KV to.
  bool any_decode = false;
  for (const WorkerLoad& w : workers) any_decode |= w.role == Role::kDecode;
  Candidates c;
  c.prefill.reserve(workers.size());
  if (any_decode) c.decode.reserve(workers.size());
  for (const WorkerLoad& w : workers) {
    if (w.role == Role::kDecode) {
      c.decode.push_back(&w);
    } else if (w.role == Role::kColocated || any_decode) {
      c.prefill.push_back(&w);
    }
  }
  // By id (callers usually list them so already: the simulator always).
  auto by_id = [](const WorkerLoad* a, const WorkerLoad* b) { return a->id < b->id; };
  if (!std::is_sorted(c.prefill.begin(), c.prefill.end(), by_id)) std::sort(c.prefill.begin(), c.prefill.end(), by_id);
  if (!std::is_sorted(c.decode.begin(), c.decode.end(), by_id)) std::sort(c.decode.begin(), c.decode.end(), by_id);
  return c;
}

absl::Status MissingRole(absl::Span<const WorkerLoad> workers) {
  bool prefill = false, decode = false;
  for (const WorkerLoad& w : workers) {
    prefill |= w.role == Role::kPrefill;
    decode |= w.role == Role::kDecode;
  }
  if (!prefill && !decode) return absl::UnavailableError("no live worker");
  if (!decode) return absl::UnavailableError("no live decode worker");
  return absl::UnavailableError("no live prefill worker");
}

absl::Status CanServe(absl::Span<const WorkerLoad> workers) {
  return SplitCandidates(workers).prefill.empty() ? MissingRole(workers) : absl::OkStatus();
}

bool FewerQueued(const WorkerLoad* a, const WorkerLoad* b) {
  if (a->queued_prefill_tokens != b->queued_prefill_tokens) return a->queued_prefill_tokens < b->queued_prefill_tokens;
  return a->running_requests < b->running_requests;
}

const WorkerLoad* LeastLoadedDecode(const Candidates& c) {
  // Candidates are in id order and min_element keeps the first minimum.
  return *std::min_element(c.decode.begin(), c.decode.end(), [](const WorkerLoad* a, const WorkerLoad* b) {
    if (a->kv_blocks_free != b->kv_blocks_free) return a->kv_blocks_free > b->kv_blocks_free;
    return a->running_requests < b->running_requests;
  });
}

absl::StatusOr<PrefillPick> PickPrefill(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers,
                                        const DispatchRequest& request) {
  const Candidates c = SplitCandidates(workers);
  if (c.prefill.empty()) return MissingRole(workers);
  return dispatcher.PickPrefill(c, request);
}

const WorkerLoad* PickDecode(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers) {
  const Candidates c = SplitCandidates(workers);
  return c.decode.empty() ? nullptr : dispatcher.PickDecode(c);
}

absl::StatusOr<Assignment> Pick(Dispatcher& dispatcher, absl::Span<const WorkerLoad> workers,
                                const DispatchRequest& request) {
  const Candidates c = SplitCandidates(workers);
  if (c.prefill.empty()) return MissingRole(workers);
  const PrefillPick p = dispatcher.PickPrefill(c, request);
  // A colocated worker is its own decode; a dedicated prefill is a candidate
  // only while some decode is live.
  const WorkerLoad* decode = p.worker->role == Role::kColocated ? p.worker : dispatcher.PickDecode(c);
  return Assignment{.prefill_id = p.worker->id,
                    .decode_id = decode->id,
                    .decode_address = decode->control_address,
                    .prefill_tokens = p.prefill_tokens};
}

absl::StatusOr<std::unique_ptr<Dispatcher>> NewDispatcher(DispatchPolicy policy, DispatchOptions o) {
  switch (policy) {
    case DispatchPolicy::kRoundRobin:
      return NewRoundRobinDispatcher();
    case DispatchPolicy::kCacheAware:
      if (o.cache == nullptr) return absl::InvalidArgumentError("cache_aware dispatch needs a view of the caches");
      if (o.uncached_weight < 0 || o.queued_weight < 0) {
        return absl::InvalidArgumentError("cache_aware weights must be >= 0");
      }
      return NewCacheAwareDispatcher(o.cache, o.uncached_weight, o.queued_weight);
    case DispatchPolicy::kLeastLoaded:
      break;
  }
  return NewLeastLoadedDispatcher();
}

}  // namespace duet::dispatch

#include "router/dispatch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace duet::router {

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
  Candidates c;
  std::vector<const WorkerLoad*> prefill_only;
  for (const WorkerLoad& w : workers) {
    switch (w.role) {
      case proto::ROLE_COLOCATED:
        c.prefill.push_back(&w);
        break;
      case proto::ROLE_PREFILL:
        prefill_only.push_back(&w);
        break;
      case proto::ROLE_DECODE:
        c.decode.push_back(&w);
        break;
      default:
        break;
    }
  }
  // A dedicated prefill is useless without a decode to hand its KV to.
  if (!c.decode.empty()) c.prefill.insert(c.prefill.end(), prefill_only.begin(), prefill_only.end());
  auto by_id = [](const WorkerLoad* a, const WorkerLoad* b) { return a->id < b->id; };
  std::sort(c.prefill.begin(), c.prefill.end(), by_id);
  std::sort(c.decode.begin(), c.decode.end(), by_id);
  return c;
}

absl::Status MissingRole(absl::Span<const WorkerLoad> workers) {
  bool prefill = false, decode = false;
  for (const WorkerLoad& w : workers) {
    prefill |= w.role == proto::ROLE_PREFILL;
    decode |= w.role == proto::ROLE_DECODE;
  }
  if (!prefill && !decode) return absl::UnavailableError("no live worker");
  if (!decode) return absl::UnavailableError("no live decode worker");
  return absl::UnavailableError("no live prefill worker");
}

absl::Status CanServe(absl::Span<const WorkerLoad> workers) {
  return SplitCandidates(workers).prefill.empty() ? MissingRole(workers) : absl::OkStatus();
}

const WorkerLoad* LeastLoadedDecode(const Candidates& c) {
  if (c.decode.empty()) return nullptr;
  // Candidates are in id order and min_element keeps the first minimum.
  return *std::min_element(c.decode.begin(), c.decode.end(), [](const WorkerLoad* a, const WorkerLoad* b) {
    if (a->kv_blocks_free != b->kv_blocks_free) return a->kv_blocks_free > b->kv_blocks_free;
    return a->running_requests < b->running_requests;
  });
}

Assignment Assign(const WorkerLoad& prefill, const WorkerLoad* decode) {
  if (prefill.role == proto::ROLE_COLOCATED || decode == nullptr) {
    return Assignment{prefill.id, prefill.id, prefill.control_address};
  }
  return Assignment{prefill.id, decode->id, decode->control_address};
}

absl::StatusOr<std::unique_ptr<Dispatcher>> NewDispatcher(DispatchPolicy policy, DispatchOptions o) {
  switch (policy) {
    case DispatchPolicy::kRoundRobin:
      return NewRoundRobinDispatcher();
    case DispatchPolicy::kCacheAware:
      if (o.index == nullptr) return absl::InvalidArgumentError("cache_aware dispatch needs the router's cache index");
      if (o.uncached_weight < 0 || o.queued_weight < 0) {
        return absl::InvalidArgumentError("cache_aware weights must be >= 0");
      }
      return NewCacheAwareDispatcher(o.index, o.uncached_weight, o.queued_weight);
    case DispatchPolicy::kLeastLoaded:
      break;
  }
  return NewLeastLoadedDispatcher();
}

}  // namespace duet::router

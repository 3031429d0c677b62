#include "router/dispatch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace duet::router {

absl::StatusOr<DispatchPolicy> ParseDispatchPolicy(absl::string_view name) {
  if (name == "least_loaded") return DispatchPolicy::kLeastLoaded;
  if (name == "round_robin") return DispatchPolicy::kRoundRobin;
  return absl::InvalidArgumentError(
      absl::StrCat("--policy must be least_loaded or round_robin, got \"", name, "\""));
}

absl::string_view DispatchPolicyName(DispatchPolicy policy) {
  return policy == DispatchPolicy::kRoundRobin ? "round_robin" : "least_loaded";
}

namespace {

struct Candidates {
  std::vector<const WorkerLoad*> prefill;  // Prefill and colocated workers.
  std::vector<const WorkerLoad*> decode;   // Decode workers only.
};

Candidates Split(absl::Span<const WorkerLoad> workers) {
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

absl::Status Missing(absl::Span<const WorkerLoad> workers) {
  bool prefill = false, decode = false;
  for (const WorkerLoad& w : workers) {
    prefill |= w.role == proto::ROLE_PREFILL;
    decode |= w.role == proto::ROLE_DECODE;
  }
  if (!prefill && !decode) return absl::UnavailableError("no live worker");
  if (!decode) return absl::UnavailableError("no live decode worker");
  return absl::UnavailableError("no live prefill worker");
}

}  // namespace

absl::Status CanServe(absl::Span<const WorkerLoad> workers) {
  return Split(workers).prefill.empty() ? Missing(workers) : absl::OkStatus();
}

absl::StatusOr<Assignment> Dispatcher::Pick(absl::Span<const WorkerLoad> workers) {
  Candidates c = Split(workers);
  if (c.prefill.empty()) return Missing(workers);

  const WorkerLoad* prefill = nullptr;
  if (policy_ == DispatchPolicy::kRoundRobin) {
    prefill = c.prefill[next_prefill_++ % c.prefill.size()];
  } else {
    // Candidates are in id order and min_element keeps the first minimum.
    prefill = *std::min_element(c.prefill.begin(), c.prefill.end(),
                                [](const WorkerLoad* a, const WorkerLoad* b) {
                                  return a->queued_prefill_tokens < b->queued_prefill_tokens;
                                });
  }
  if (prefill->role == proto::ROLE_COLOCATED) {
    return Assignment{prefill->id, prefill->id, prefill->control_address};
  }

  const WorkerLoad* decode = nullptr;
  if (policy_ == DispatchPolicy::kRoundRobin) {
    decode = c.decode[next_decode_++ % c.decode.size()];
  } else {
    decode = *std::min_element(c.decode.begin(), c.decode.end(),
                               [](const WorkerLoad* a, const WorkerLoad* b) {
                                 if (a->kv_blocks_free != b->kv_blocks_free) {
                                   return a->kv_blocks_free > b->kv_blocks_free;
                                 }
                                 return a->running_requests < b->running_requests;
                               });
  }
  return Assignment{prefill->id, decode->id, decode->control_address};
}

}  // namespace duet::router

// least_loaded: the prefill with the fewest queued prefill tokens, the decode
// with the most free KV blocks (dispatch.h).
#include <algorithm>

#include "router/dispatch.h"

namespace duet::router {
namespace {

class LeastLoaded : public Dispatcher {
 public:
  absl::StatusOr<Assignment> Pick(absl::Span<const WorkerLoad> workers, const DispatchRequest&) override {
    const Candidates c = SplitCandidates(workers);
    if (c.prefill.empty()) return MissingRole(workers);
    // Candidates are in id order and min_element keeps the first minimum.
    const WorkerLoad* prefill = *std::min_element(
        c.prefill.begin(), c.prefill.end(),
        [](const WorkerLoad* a, const WorkerLoad* b) { return a->queued_prefill_tokens < b->queued_prefill_tokens; });
    return Assign(*prefill, LeastLoadedDecode(c));
  }
};

}  // namespace

std::unique_ptr<Dispatcher> NewLeastLoadedDispatcher() { return std::make_unique<LeastLoaded>(); }

}  // namespace duet::router

// least_loaded: the prefill with the fewest queued prefill tokens (then the
// fewest running requests), the decode with the most free KV blocks
// (dispatch.h).
#include <algorithm>

#include "dispatch/dispatch.h"

namespace duet::dispatch {
namespace {

class LeastLoaded : public Dispatcher {
 public:
  PrefillPick PickPrefill(const Candidates& c, const DispatchRequest&) override {
    // Candidates are in id order and min_element keeps the first minimum.
    return PrefillPick{.worker = *std::min_element(c.prefill.begin(), c.prefill.end(), FewerQueued)};
  }
  const WorkerLoad* PickDecode(const Candidates& c) override { return LeastLoadedDecode(c); }
};

}  // namespace

std::unique_ptr<Dispatcher> NewLeastLoadedDispatcher() { return std::make_unique<LeastLoaded>(); }

}  // namespace duet::dispatch

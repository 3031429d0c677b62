// round_robin: prefills and decodes each in turn, in id order, loads ignored
// (a baseline; dispatch.h).
#include "dispatch/dispatch.h"

namespace duet::dispatch {
namespace {

class RoundRobin : public Dispatcher {
 public:
  absl::StatusOr<PrefillPick> PickPrefill(absl::Span<const WorkerLoad> workers, const DispatchRequest&) override {
    const Candidates c = SplitCandidates(workers);
    if (c.prefill.empty()) return MissingRole(workers);
    return PrefillPick{.worker = c.prefill[next_prefill_++ % c.prefill.size()]};
  }
  const WorkerLoad* PickDecode(absl::Span<const WorkerLoad> workers) override {
    const Candidates c = SplitCandidates(workers);
    if (c.decode.empty()) return nullptr;
    return c.decode[next_decode_++ % c.decode.size()];
  }

 private:
  uint64_t next_prefill_ = 0;
  uint64_t next_decode_ = 0;
};

}  // namespace

std::unique_ptr<Dispatcher> NewRoundRobinDispatcher() { return std::make_unique<RoundRobin>(); }

}  // namespace duet::dispatch

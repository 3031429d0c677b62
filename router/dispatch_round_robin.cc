// round_robin: prefills and decodes each in turn, in id order, loads ignored
// (a baseline; dispatch.h).
#include "router/dispatch.h"

namespace duet::router {
namespace {

class RoundRobin : public Dispatcher {
 public:
  absl::StatusOr<Assignment> Pick(absl::Span<const WorkerLoad> workers, const DispatchRequest&) override {
    const Candidates c = SplitCandidates(workers);
    if (c.prefill.empty()) return MissingRole(workers);
    const WorkerLoad* prefill = c.prefill[next_prefill_++ % c.prefill.size()];
    if (prefill->role == proto::ROLE_COLOCATED) return Assign(*prefill, nullptr);
    return Assign(*prefill, c.decode[next_decode_++ % c.decode.size()]);
  }

 private:
  uint64_t next_prefill_ = 0;
  uint64_t next_decode_ = 0;
};

}  // namespace

std::unique_ptr<Dispatcher> NewRoundRobinDispatcher() { return std::make_unique<RoundRobin>(); }

}  // namespace duet::router

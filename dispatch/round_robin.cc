// round_robin: prefills and decodes each in turn, in id order, loads ignored
// (a baseline; dispatch.h).
#include "dispatch/dispatch.h"

namespace duet::dispatch {
namespace {

class RoundRobin : public Dispatcher {
 public:
  PrefillPick PickPrefill(const Candidates& c, const DispatchRequest&) override {
    return PrefillPick{.worker = c.prefill[next_prefill_++ % c.prefill.size()]};
  }
  const WorkerLoad* PickDecode(const Candidates& c) override { return c.decode[next_decode_++ % c.decode.size()]; }

 private:
  uint64_t next_prefill_ = 0;
  uint64_t next_decode_ = 0;
};

}  // namespace

std::unique_ptr<Dispatcher> NewRoundRobinDispatcher() { return std::make_unique<RoundRobin>(); }

}  // namespace duet::dispatch

// FrameSink: where a worker service sends control-plane frames (to the
// router, to peer workers) — the seam between a role's logic and the process
// shell. WorkerRuntime implements it over TCP; tests implement it with a fake
// that records frames, so services run in-process without sockets.
//
//   void Emit(FrameSink* sink, proto::Frame f) { sink->SendToRouter(f); }
//   sink->SendToPeer(handle.control_address(), released, nullptr);
//
// Thread-safety: implementations accept calls from any thread.
#ifndef DUET_WORKER_FRAME_SINK_H_
#define DUET_WORKER_FRAME_SINK_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/control.pb.h"

namespace duet::worker {

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void SendToRouter(const proto::Frame&) = 0;
  virtual void SendToPeer(const std::string& address, const proto::Frame&,
                          std::function<void(absl::Status)> on_error) = 0;
  virtual std::string worker_id() const = 0;
  virtual std::string control_address() const = 0;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_FRAME_SINK_H_

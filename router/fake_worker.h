// A scriptable stand-in for a worker, speaking the real control protocol over
// real sockets: for the registry's and the router's tests.
//
//   FakeWorker w(io, {.id = "c0", .role = proto::ROLE_COLOCATED, .model = "tiny"});
//   w.on_frame = [](FakeWorker& w, const proto::Frame& f) { ... w.Send(reply); };
//   auto reply = w.Register(router.control_address());   // waits for RegisterReply
//   proto::Frame f = w.NextFrame();                       // what the router sent
//
// The worker listens on its own control port, registers on a connection of
// its own, and treats the connection on which a RegisterReply greeting
// arrives as the router's (as worker/runtime.cc does). Waits give up after
// a generous deadline so a broken router fails the test instead of hanging.
// Thread-safe; on_frame runs on the io thread.
#ifndef DUET_ROUTER_FAKE_WORKER_H_
#define DUET_ROUTER_FAKE_WORKER_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "rpc/connection.h"
#include "base/io_thread.h"

namespace duet::router::testing {

struct FakeWorkerOptions {
  std::string id;
  proto::Role role = proto::ROLE_COLOCATED;
  std::string model;
  uint32_t protocol_version = proto::PROTOCOL_VERSION_CURRENT;
  int64_t kv_blocks_total = 100;
  std::string control_address;  // Default: the address it listens on.
  uint64_t incarnation = 0;     // Register's (0: unknown).
};

inline constexpr absl::Duration kWaitLimit = absl::Seconds(20);

class FakeWorker {
 public:
  FakeWorker(IoThread& io, FakeWorkerOptions options);
  ~FakeWorker();

  // Connects to the router, sends Register and waits for the RegisterReply.
  absl::StatusOr<proto::RegisterReply> Register(const std::string& router_address);
  // Waits for the router's greeting connection; false on timeout.
  bool WaitGreeting();

  void Heartbeat(const proto::WorkerStats& stats);
  // Sends on the router's connection (events, WorkerStats).
  void Send(const proto::Frame& frame);

  // The next frame the router sent that on_frame did not consume (a
  // CacheSnapshotRequest never is: a fake has no cache); fails the
  // wait (nullopt-like: a default Frame and `ok` false) after the deadline.
  absl::StatusOr<proto::Frame> NextFrame();
  // Waits for a frame matching `pred` among those received (consumed ones included).
  absl::StatusOr<proto::Frame> WaitFor(std::function<bool(const proto::Frame&)> pred);

  void CloseRouterConnection();
  void CloseRegistration();
  // The worker process died, as the router sees it: its registration
  // connection closes and it stops listening (the router then closes its
  // own connection to it).
  void Kill();
  bool WaitRegistrationClosed();
  bool WaitRouterConnectionClosed();

  const std::string& control_address() const;

  // Runs for every frame from the router; return true to consume it (it is
  // then not queued for NextFrame).
  std::function<bool(FakeWorker&, const proto::Frame&)> on_frame;

 private:
  // Shared with the connections' handlers, which may run after this
  // FakeWorker is gone (until the io thread stops).
  struct State;
  std::shared_ptr<State> state_;
};

// Frames a worker sends about request `id`: its first token (logprob
// -0.25, from `worker`), one further token (logprob -0.5), and its end.
proto::Frame FirstTokenFrame(uint64_t id, int32_t token, const std::string& worker);
proto::Frame TokenFrame(uint64_t id, int32_t token);
proto::Frame FinishFrame(uint64_t id, proto::FinishReason reason, int error_code = 0, std::string error = "");

}  // namespace duet::router::testing

#endif  // DUET_ROUTER_FAKE_WORKER_H_

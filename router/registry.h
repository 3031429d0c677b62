// The router's worker registry: the control port workers register on, the
// router's own connection to each worker, heartbeats and liveness.
//
//   WorkerRegistry reg(io, {.model = "tiny"}, &listener);
//   RETURN_IF_ERROR(reg.Start());                 // listens on options.listen
//   reg.Send(worker_id, frame);                   // PrefillRequest, Cancel, StatsRequest
//
// Registration (proto/README.md): a worker connects to the control port and
// sends Register. A wrong protocol version or model is refused with
// RegisterReply{ok=false, error}. Otherwise the registry connects to the
// worker's control_address (on its connector thread: rpc::Connect blocks),
// greets it there with RegisterReply{ok=true} (which tells the worker that
// connection is the router's), marks the worker live, and only then answers
// RegisterReply{ok=true, heartbeat_interval_ms} on the registration
// connection. Heartbeats arrive on the registration connection; worker
// events (FirstToken, TokenBatch, Finish, WorkerStats) on the router's
// connection. A worker is removed when either connection closes or when it
// misses `missed_heartbeats` intervals (checked by a timer on the io thread,
// against the injectable clock). A new registration under a live worker's id
// replaces it (the worker reconnected before its old connection was seen to
// close).
//
// The listener hears about live and lost workers and gets every worker event
// frame. It is called with no registry lock held, from the io thread, the
// connector thread, or the thread calling CheckHeartbeats/Stop. All public
// methods are thread-safe; Send never blocks.
#ifndef DUET_ROUTER_REGISTRY_H_
#define DUET_ROUTER_REGISTRY_H_

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "proto/control.pb.h"
#include "proto/frame.h"
#include "dispatch/dispatch.h"
#include "rpc/connection.h"

namespace duet::router {

class RegistryListener {
 public:
  virtual ~RegistryListener() = default;
  // `restarted`: the id was live before, in another process (Register's
  // incarnation).
  virtual void OnWorkerLive(const std::string& worker_id, proto::Role role, bool restarted) = 0;
  // Called once per live worker that is removed, for any reason.
  virtual void OnWorkerLost(const std::string& worker_id, proto::Role role,
                            const std::string& reason) = 0;
  // A frame the worker sent on the router's connection to it.
  virtual void OnWorkerFrame(const std::string& worker_id, proto::Frame frame) = 0;
  // A heartbeat was recorded (after the registry's view is updated).
  virtual void OnHeartbeat(const std::string& worker_id, const proto::WorkerStats& stats) {}
};

struct RegistryOptions {
  std::string listen = "127.0.0.1:0";
  std::string model;  // Served model name; a worker serving another is refused.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  int missed_heartbeats = 3;  // Intervals of silence before a worker is dropped.
  absl::Duration connect_timeout = absl::Seconds(2);
  // A refused worker's connection is closed this long after the reply, so
  // the reply reaches it (closing at once could reset it away).
  absl::Duration refuse_close_delay = absl::Seconds(1);
  Clock* clock = RealClock();
};

// What /stats shows about one worker.
struct WorkerSnapshot {
  std::string id;
  proto::Role role = proto::ROLE_UNSPECIFIED;
  std::string control_address;
  uint32_t metrics_port = 0;
  int64_t max_model_len = 0;
  int64_t block_size = 0;    // Tokens per KV block.
  proto::WorkerStats stats;  // Latest heartbeat or WorkerStats reply.
  absl::Time stats_time;
  int64_t dispatched = 0;    // Attempts the router assigned to it since it registered.
  bool draining = false;     // It takes nothing new.
  bool flex = false;         // Started with --role flex: takes SwitchRole.
};

using proto::RoleName;  // "prefill", "decode", "colocated"

class WorkerRegistry {
 public:
  WorkerRegistry(boost::asio::io_context& io, RegistryOptions options, RegistryListener* listener);
  ~WorkerRegistry();  // Stops.
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  absl::Status Start();
  // Closes the control port and every worker connection (listeners hear
  // nothing more). The io_context must still be running.
  void Stop();

  std::string address() const;  // HOST:PORT of the control port.

  // Queues a frame on the router's connection to a live worker; false when
  // the worker is not live.
  bool Send(const std::string& worker_id, const proto::Frame& frame);

  // Live workers that take new requests (not draining).
  std::vector<dispatch::WorkerLoad> LiveLoads() const;
  std::vector<WorkerSnapshot> Snapshot() const;
  // Counts a dispatch of `tokens` (prompt + resumed), sent as `request_id`,
  // against the workers' loads. The prefill's queue is the router's own
  // book: the tokens it computes (assignment.prefill_tokens when the policy
  // knows them, else all) count until Uncharge, when the prefill is done
  // (its first token) or the request is forgotten. A heartbeat's
  // queued_prefill_tokens is not used for dispatch: it lags by up to an
  // interval and counts a waiting prompt whole, cached prefix included,
  // where the charge counts what is computed. The decode's charge (the
  // blocks all the tokens fill, at its block size, and one request) counts
  // until its heartbeats do: a prefill's (colocated) heartbeat counts the
  // requests up to its stats' last_request_id, a decode's counts them all.
  struct Charged {
    std::string prefill_id;
    uint64_t request_id = 0;
  };
  Charged Charge(const dispatch::Assignment& assignment, int64_t tokens, uint64_t request_id);
  void Uncharge(const Charged& charged);

  // Drops every live worker silent for missed_heartbeats intervals. The
  // io thread's timer calls it; tests with a FakeClock call it directly.
  void CheckHeartbeats();

 private:
  struct Worker;
  struct PendingCharge {  // One dispatch on one worker.
    uint64_t request_id = 0;
    int64_t blocks = 0;
    int64_t requests = 0;
  };
  using WorkerPtr = std::shared_ptr<Worker>;

  void OnAccepted(rpc::ConnectionPtr conn);
  void OnRegistrationFrame(const rpc::ConnectionPtr& conn, proto::Frame frame);
  void OnRegister(const rpc::ConnectionPtr& conn, const proto::Register& reg);
  void Refuse(const rpc::ConnectionPtr& conn, const std::string& error);
  void ConnectorLoop();
  void FinishConnect(const WorkerPtr& worker);
  void OnWorkerConnFrame(const WorkerPtr& worker, proto::Frame frame);
  // Removes `worker` if it is still registered; closes its connections
  // (unless !close) and tells the listener when it was live. Call with no
  // lock held.
  void Remove(const WorkerPtr& worker, const std::string& reason, bool close = true);
  // Every callback the registry hands to asio or rpc holds a Life, not the
  // registry: Stop clears `self`, so a late callback finds nothing to call.
  struct Life;
  struct Ticker;
  static void Arm(const std::shared_ptr<Ticker>& ticker);

  boost::asio::io_context& io_;
  const RegistryOptions options_;
  RegistryListener* const listener_;
  std::unique_ptr<rpc::Server> server_;
  // The heartbeat timer, shared with its pending handler so that a handler
  // that fires after Stop finds no registry instead of a dangling one.
  std::shared_ptr<Life> life_;
  std::shared_ptr<Ticker> ticker_;

  mutable absl::Mutex mu_;
  std::map<std::string, WorkerPtr> workers_ ABSL_GUARDED_BY(mu_);
  std::deque<WorkerPtr> connect_queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  // The last Register incarnation of every id that ever registered.
  std::map<std::string, uint64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  std::thread connector_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_REGISTRY_H_

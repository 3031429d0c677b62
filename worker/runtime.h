// The process shell every worker role shares: the control server, the
// registration with the router (with heartbeats and reconnection), and
// connections to peer workers. The role's logic is a WorkerService.
//
//   WorkerRuntime rt(options);
//   RETURN_IF_ERROR(rt.Start(service.get()));   // listens, registers, heartbeats
//   rt.SendToRouter(frame);                     // FirstToken, TokenBatch, Finish
//   rt.SendToPeer(decode_address, offer, on_error);
//
// Connections: the worker listens on `listen` (port 0 picks one); it opens
// its registration connection to `router_address` and sends Register; the
// router then connects to the worker's control address and greets with a
// RegisterReply, which marks that connection as the router's: events for the
// router go there. Other workers (prefill -> decode offers, decode -> prefill
// releases) connect to the same control address. Frames from any connection
// reach WorkerService::OnFrame on the io thread; a service must not block
// there (queue work for its engine thread instead).
//
// Thread-safety: SendToRouter and SendToPeer may be called from any thread.
#ifndef DUET_WORKER_RUNTIME_H_
#define DUET_WORKER_RUNTIME_H_

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "http/server.h"
#include "proto/control.pb.h"
#include "rpc/connection.h"
#include "base/io_thread.h"
#include "worker/frame_sink.h"

namespace duet::worker {

// What a role tells the router about itself.
struct RegistrationInfo {
  proto::Role role = proto::ROLE_UNSPECIFIED;
  bool flex = false;           // Takes SwitchRole (--role flex).
  std::string model;           // Served model name.
  std::string data_address;    // kvtransfer address() bytes ("" when none).
  std::string transport;       // kvtransfer Name().
  int64_t kv_blocks_total = 0;
  proto::KvLayout layout;
  int64_t max_model_len = 0;
};

// Holding no request and no lease: what a drain waits for.
inline bool WorkerIdle(const proto::WorkerStats& s) {
  return s.queued_requests() == 0 && s.running_requests() == 0 && s.leased_blocks() == 0;
}

class WorkerService {
 public:
  virtual ~WorkerService() = default;
  virtual RegistrationInfo Registration() = 0;
  // A frame from the router or a peer worker. Runs on the io thread.
  virtual void OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) = 0;
  // The router connection was lost: the router will drop this worker's
  // requests; the service should cancel everything it holds for them.
  virtual void OnRouterLost() {}
  // Current numbers for heartbeats and /stats. Thread-safe.
  virtual proto::WorkerStats Stats() = 0;
};

struct RuntimeOptions {
  std::string worker_id;        // Unique in the cluster.
  std::string listen = "127.0.0.1:0";
  std::string router_address;   // HOST:PORT of the router's control port.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration connect_timeout = absl::Seconds(2);
  int metrics_port = -1;        // -1: no metrics server; 0: pick one.
  std::string metrics_host = "127.0.0.1";
};

class WorkerRuntime : public FrameSink {
 public:
  explicit WorkerRuntime(RuntimeOptions options);
  ~WorkerRuntime();
  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;

  // Listens, then registers in the background (retrying with backoff until
  // the router answers). A router that refuses the registration (protocol
  // version, model) is fatal: `on_fatal` gets the reason.
  absl::Status Start(WorkerService* service, std::function<void(absl::Status)> on_fatal);
  void Stop();
  // From now on every heartbeat says the worker is draining (one is sent at
  // once), so the router sends it nothing new; what it has runs on.
  void Drain();
  // Registers again, no longer draining: the registration connection
  // closes (the router drops the worker's old self) and the worker
  // registers anew with the service's Registration() (a flex worker's new
  // role).
  void Reregister();

  // Sends on the router's connection; dropped (and logged once) when there is none.
  void SendToRouter(const proto::Frame& frame) override;
  // Sends to a peer's control address, connecting first if needed (in the
  // background; frames queue meanwhile). on_error runs (on some runtime
  // thread) if the peer cannot be reached or the connection drops with
  // frames unsent.
  void SendToPeer(const std::string& address, const proto::Frame& frame,
                  std::function<void(absl::Status)> on_error = nullptr) override;

  std::string worker_id() const override { return options_.worker_id; }
  std::string control_address() const override;
  int metrics_port() const { return metrics_port_; }
  boost::asio::io_context& io() { return io_.context(); }


 private:
  void RegistrationLoop();
  void SendHeartbeat(const rpc::ConnectionPtr& registration);
  void OnAccepted(rpc::ConnectionPtr conn);
  struct Peer;

  const RuntimeOptions options_;
  // This process's, in every Register: the router tells a restart from a
  // reconnection by it.
  const uint64_t incarnation_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  WorkerService* service_ = nullptr;
  std::function<void(absl::Status)> on_fatal_;
  IoThread io_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<http::HttpServer> metrics_server_;
  int metrics_port_ = -1;

  absl::Mutex mu_;
  rpc::ConnectionPtr router_conn_ ABSL_GUARDED_BY(mu_);
  rpc::ConnectionPtr registration_conn_ ABSL_GUARDED_BY(mu_);  // Where heartbeats go, once registered.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::thread registration_thread_;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_RUNTIME_H_

#include "worker/runtime.h"

#include <deque>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "proto/frame.h"

namespace duet::worker {

struct WorkerRuntime::Peer {
  rpc::ConnectionPtr conn;
  bool connecting = false;
  std::deque<proto::Frame> pending;
  std::vector<std::function<void(absl::Status)>> on_error;
  std::thread connector;
};

WorkerRuntime::WorkerRuntime(RuntimeOptions options) : options_(std::move(options)) {}

WorkerRuntime::~WorkerRuntime() { Stop(); }

std::string WorkerRuntime::control_address() const {
  return server_ ? server_->address() : "";
}

absl::Status WorkerRuntime::Start(WorkerService* service, std::function<void(absl::Status)> on_fatal) {
  service_ = service;
  on_fatal_ = std::move(on_fatal);
  auto server = rpc::Server::Listen(io_.context(), options_.listen,
                                    [this](rpc::ConnectionPtr c) { OnAccepted(std::move(c)); });
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  LOG(INFO) << "worker " << options_.worker_id << " listening on " << server_->address();
  if (options_.metrics_port >= 0) {
    auto m = http::HttpServer::Start(
        io_.context(), absl::StrCat(options_.metrics_host, ":", options_.metrics_port), http::ServeMetricsAndHealth);
    if (!m.ok()) return m.status();
    metrics_server_ = std::move(*m);
    metrics_port_ = metrics_server_->port();
    LOG(INFO) << "metrics on " << options_.metrics_host << ":" << metrics_port_ << "/metrics";
  }
  registration_thread_ = std::thread([this] { RegistrationLoop(); });
  return absl::OkStatus();
}

void WorkerRuntime::Stop() {
  std::vector<std::shared_ptr<Peer>> peers;
  rpc::ConnectionPtr router;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [addr, p] : peers_) peers.push_back(p);
    peers_.clear();
    router = router_conn_;
    router_conn_.reset();
    registration_conn_.reset();
  }
  if (registration_thread_.joinable()) registration_thread_.join();
  for (auto& p : peers) {
    if (p->connector.joinable()) p->connector.join();
    if (p->conn) p->conn->Close();
  }
  if (router) router->Close();
  if (server_) server_->Stop();
  if (metrics_server_) metrics_server_->Stop();
  io_.Stop();
}

void WorkerRuntime::OnAccepted(rpc::ConnectionPtr conn) {
  conn->Start({
      .on_frame =
          [this](const rpc::ConnectionPtr& c, proto::Frame frame) {
            if (frame.has_register_reply()) {
              absl::MutexLock lock(&mu_);
              if (router_conn_ != c) {
                router_conn_ = c;
                LOG(INFO) << "router connected from " << c->peer();
              }
              return;
            }
            service_->OnFrame(c, std::move(frame));
          },
      .on_close =
          [this](const rpc::ConnectionPtr& c, const absl::Status& status) {
            bool was_router = false;
            {
              absl::MutexLock lock(&mu_);
              if (router_conn_ == c) {
                router_conn_.reset();
                was_router = !stopping_;
              }
            }
            if (was_router) {
              LOG(WARNING) << "lost the router's connection: " << status;
              service_->OnRouterLost();
            }
          },
  });
}

void WorkerRuntime::SendToRouter(const proto::Frame& frame) {
  rpc::ConnectionPtr c;
  {
    absl::MutexLock lock(&mu_);
    c = router_conn_;
  }
  if (c == nullptr) {
    LOG(WARNING) << "no router connection; dropping a frame for the router";
    return;
  }
  c->Send(frame);
}

void WorkerRuntime::SendToPeer(const std::string& address, const proto::Frame& frame,
                               std::function<void(absl::Status)> on_error) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  auto& p = peers_[address];
  if (!p) p = std::make_shared<Peer>();
  if (p->conn && !p->conn->closed()) {
    p->conn->Send(frame);
    return;
  }
  p->pending.push_back(frame);
  if (on_error) p->on_error.push_back(std::move(on_error));
  if (p->connecting) return;
  p->connecting = true;
  if (p->connector.joinable()) p->connector.detach();  // A finished earlier attempt.
  std::shared_ptr<Peer> peer = p;
  p->connector = std::thread([this, address, peer] {
    auto conn = rpc::Connect(io_.context(), address, options_.connect_timeout);
    std::vector<std::function<void(absl::Status)>> errors;
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      peer->connecting = false;
      if (!conn.ok() || stopping_) {
        failure = conn.ok() ? absl::CancelledError("worker stopping") : conn.status();
        errors.swap(peer->on_error);
        peer->pending.clear();
        auto it = peers_.find(address);
        if (it != peers_.end() && it->second == peer) {
          it->second->connector.detach();
          peers_.erase(it);
        }
      } else {
        peer->conn = *conn;
        peer->conn->Start({
            .on_frame = [this](const rpc::ConnectionPtr& c, proto::Frame f) { service_->OnFrame(c, std::move(f)); },
            // Weak: the peer holds the connection, which holds this handler.
            .on_close =
                [this, address, weak = std::weak_ptr<Peer>(peer)](const rpc::ConnectionPtr&, const absl::Status& st) {
                  std::shared_ptr<Peer> peer = weak.lock();
                  if (!peer) return;
                  std::vector<std::function<void(absl::Status)>> errs;
                  {
                    absl::MutexLock lock(&mu_);
                    auto it = peers_.find(address);
                    if (it != peers_.end() && it->second == peer && !peer->connecting) {
                      errs.swap(peer->on_error);
                      it->second->connector.detach();
                      peers_.erase(it);
                    }
                  }
                  for (auto& e : errs) e(absl::UnavailableError(absl::StrCat("peer ", address, " lost: ", st.message())));
                },
        });
        while (!peer->pending.empty()) {
          peer->conn->Send(peer->pending.front());
          peer->pending.pop_front();
        }
      }
    }
    if (!failure.ok()) {
      LOG(WARNING) << "cannot reach peer " << address << ": " << failure;
      for (auto& e : errors) e(failure);
    }
  });
}

void WorkerRuntime::SendHeartbeat(const rpc::ConnectionPtr& conn) {
  proto::Frame hb = proto::NewFrame();
  *hb.mutable_heartbeat()->mutable_stats() = service_->Stats();
  {
    absl::MutexLock lock(&mu_);
    hb.mutable_heartbeat()->mutable_stats()->set_draining(draining_);
  }
  conn->Send(hb);
}

void WorkerRuntime::Drain() {
  rpc::ConnectionPtr conn;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    conn = registration_conn_;
  }
  if (conn) SendHeartbeat(conn);
}

void WorkerRuntime::Reregister() {
  rpc::ConnectionPtr conn;
  {
    absl::MutexLock lock(&mu_);
    draining_ = false;
    conn = registration_conn_;
  }
  if (conn) conn->Close();
}

void WorkerRuntime::RegistrationLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  int failures = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    auto conn = rpc::Connect(io_.context(), options_.router_address, options_.connect_timeout);
    if (!conn.ok()) {
      if (failures++ % 20 == 0) LOG(WARNING) << "router not reachable yet: " << conn.status();
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
      backoff = std::min(backoff * 2, absl::Seconds(5));
      continue;
    }
    failures = 0;
    backoff = absl::Milliseconds(100);
    // Registration state shared with the connection's handlers.
    struct State {
      absl::Mutex mu;
      bool closed = false;
      bool registered = false;
      absl::Status refused;
      absl::Duration interval;  // The router's heartbeat interval, once it answers.
    };
    auto state = std::make_shared<State>();
    state->interval = options_.heartbeat_interval;
    (*conn)->Start({
        .on_frame =
            [state](const rpc::ConnectionPtr&, proto::Frame f) {
              if (!f.has_register_reply()) return;
              absl::MutexLock lock(&state->mu);
              if (f.register_reply().ok()) {
                state->registered = true;
                if (f.register_reply().heartbeat_interval_ms() > 0) {
                  state->interval = absl::Milliseconds(f.register_reply().heartbeat_interval_ms());
                }
              } else {
                state->refused = absl::FailedPreconditionError(
                    absl::StrCat("the router refused this worker: ", f.register_reply().error()));
              }
            },
        .on_close =
            [state](const rpc::ConnectionPtr&, const absl::Status&) {
              absl::MutexLock lock(&state->mu);
              state->closed = true;
            },
    });
    RegistrationInfo info = service_->Registration();
    proto::Frame reg = proto::NewFrame();
    auto* r = reg.mutable_register_();
    r->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    r->set_worker_id(options_.worker_id);
    r->set_role(info.role);
    r->set_model(info.model);
    r->set_control_address(server_->address());
    r->set_data_address(info.data_address);
    r->set_transport(info.transport);
    r->set_metrics_port(metrics_port_ < 0 ? 0 : metrics_port_);
    r->set_kv_blocks_total(info.kv_blocks_total);
    *r->mutable_layout() = info.layout;
    r->set_max_model_len(info.max_model_len);
    r->set_incarnation(incarnation_);
    r->set_flex(info.flex);
    (*conn)->Send(reg);
    {
      absl::MutexLock lock(&mu_);
      registration_conn_ = *conn;
    }
    // Heartbeats until the connection ends or the worker stops.
    while (true) {
      {
        absl::MutexLock lock(&state->mu);
        // The router's interval rules once it has answered: it drops
        // workers by its own clock.
        state->mu.AwaitWithTimeout(
            absl::Condition(+[](State* s) { return s->closed || !s->refused.ok(); }, state.get()),
            std::min(options_.heartbeat_interval, state->interval));
        if (!state->refused.ok()) {
          LOG(ERROR) << state->refused;
          (*conn)->Close();
          if (on_fatal_) on_fatal_(state->refused);
          return;
        }
        if (state->closed) break;
      }
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          (*conn)->Close();
          return;
        }
      }
      SendHeartbeat(*conn);
    }
    {
      absl::MutexLock lock(&mu_);
      registration_conn_.reset();
    }
    LOG(WARNING) << "registration connection to the router lost; reconnecting";
  }
}

}  // namespace duet::worker

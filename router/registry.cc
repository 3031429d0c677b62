#include "router/registry.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "proto/frame.h"

namespace duet::router {

namespace asio = boost::asio;

struct WorkerRegistry::Worker {
  uint64_t generation = 0;
  proto::Register reg;
  rpc::ConnectionPtr reg_conn;  // Worker -> router: Register, heartbeats.
  rpc::ConnectionPtr conn;      // Router -> worker: requests and events.
  bool live = false;
  bool removed = false;
  proto::WorkerStats stats;
  absl::Time stats_time;
  absl::Time last_heartbeat;
  // Dispatches its stats do not count yet (their decode blocks and
  // requests), oldest first.
  std::deque<PendingCharge> charges;
  // Prefills the router sent it that have not produced their first token:
  // request id -> the tokens dispatch charged; their sum, kept as they come
  // and go (dispatch reads it on every pick), is its queue.
  absl::flat_hash_map<uint64_t, int64_t> prefilling;
  int64_t prefilling_tokens = 0;
  int64_t dispatched = 0;  // Attempts assigned to it since it registered.
  bool restarted = false;  // Its id registered before, from another process.
  bool draining = false;   // Its last heartbeat said so: nothing new goes to it.
};

struct WorkerRegistry::Life {
  absl::Mutex mu;
  WorkerRegistry* self ABSL_GUARDED_BY(mu) = nullptr;

  // Runs fn(registry) unless the registry has stopped. The reader lock makes
  // Stop wait for callbacks already running.
  template <typename Fn>
  void With(Fn&& fn) {
    absl::ReaderMutexLock lock(&mu);
    if (self != nullptr) fn(self);
  }
};

struct WorkerRegistry::Ticker {
  Ticker(asio::io_context& io, std::shared_ptr<Life> l, absl::Duration p)
      : timer(io), life(std::move(l)), period(p) {}
  asio::steady_timer timer;  // Touched on the io thread only.
  std::shared_ptr<Life> life;
  absl::Duration period;
};

namespace {

// Closes on the io thread later, never inline: an inline close would run the
// connection's on_close handler inside the caller's stack (and its locks).
void CloseLater(asio::io_context& io, rpc::ConnectionPtr conn) {
  if (conn == nullptr) return;
  asio::post(io, [conn] { conn->Close(); });
}

// Registration accepts only these three roles.
dispatch::Role DispatchRole(proto::Role role) {
  switch (role) {
    case proto::ROLE_DECODE: return dispatch::Role::kDecode;
    case proto::ROLE_COLOCATED: return dispatch::Role::kColocated;
    default: return dispatch::Role::kPrefill;
  }
}

}  // namespace

WorkerRegistry::WorkerRegistry(asio::io_context& io, RegistryOptions options, RegistryListener* listener)
    : io_(io), options_(std::move(options)), listener_(listener), life_(std::make_shared<Life>()) {
  absl::MutexLock lock(&life_->mu);
  life_->self = this;
}

WorkerRegistry::~WorkerRegistry() { Stop(); }

absl::Status WorkerRegistry::Start() {
  std::shared_ptr<Life> life = life_;
  auto server = rpc::Server::Listen(io_, options_.listen, [life](rpc::ConnectionPtr c) {
    bool taken = false;
    life->With([&](WorkerRegistry* self) {
      self->OnAccepted(c);
      taken = true;
    });
    if (!taken) c->Close();
  });
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  connector_ = std::thread([this] { ConnectorLoop(); });
  ticker_ = std::make_shared<Ticker>(io_, life_, options_.heartbeat_interval / 2);
  std::shared_ptr<Ticker> ticker = ticker_;
  asio::post(io_, [ticker] { Arm(ticker); });
  LOG(INFO) << "router control port listening on " << server_->address();
  return absl::OkStatus();
}

void WorkerRegistry::Stop() {
  {
    absl::MutexLock lock(&life_->mu);  // Waits for running callbacks.
    if (life_->self == nullptr) return;
    life_->self = nullptr;
  }
  std::map<std::string, WorkerPtr> workers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    workers.swap(workers_);
    connect_queue_.clear();
  }
  if (connector_.joinable()) connector_.join();
  if (server_) server_->Stop();
  for (auto& [id, w] : workers) {
    CloseLater(io_, w->reg_conn);
    CloseLater(io_, w->conn);
  }
  if (ticker_) {
    std::shared_ptr<Ticker> ticker = ticker_;
    asio::post(io_, [ticker] { ticker->timer.cancel(); });
  }
}

std::string WorkerRegistry::address() const { return server_ ? server_->address() : ""; }

void WorkerRegistry::Arm(const std::shared_ptr<Ticker>& ticker) {
  ticker->timer.expires_after(absl::ToChronoMilliseconds(std::max(ticker->period, absl::Milliseconds(1))));
  ticker->timer.async_wait([ticker](boost::system::error_code ec) {
    if (ec) return;
    bool alive = false;
    ticker->life->With([&](WorkerRegistry* self) {
      self->CheckHeartbeats();
      alive = true;
    });
    if (alive) Arm(ticker);
  });
}

void WorkerRegistry::OnAccepted(rpc::ConnectionPtr conn) {
  std::shared_ptr<Life> life = life_;
  conn->Start({
      .on_frame =
          [life](const rpc::ConnectionPtr& c, proto::Frame frame) {
            life->With([&](WorkerRegistry* self) { self->OnRegistrationFrame(c, std::move(frame)); });
          },
      .on_close =
          [life](const rpc::ConnectionPtr& c, const absl::Status& status) {
            life->With([&](WorkerRegistry* self) {
              WorkerPtr w;
              {
                absl::MutexLock lock(&self->mu_);
                auto it = self->workers_.find(c->tag);
                if (it != self->workers_.end() && it->second->reg_conn == c) w = it->second;
              }
              if (w) self->Remove(w, absl::StrCat("registration connection closed: ", status.message()));
            });
          },
  });
}

void WorkerRegistry::OnRegistrationFrame(const rpc::ConnectionPtr& conn, proto::Frame frame) {
  if (frame.has_register_()) {
    if (!conn->tag.empty()) {
      LOG(WARNING) << "worker " << conn->tag << " sent Register twice; ignored";
      return;
    }
    if (frame.protocol_version() != proto::PROTOCOL_VERSION_CURRENT &&
        frame.register_().protocol_version() == proto::PROTOCOL_VERSION_CURRENT) {
      // The Register's own field is what workers set; a frame-level mismatch
      // is as fatal, so report it the same way.
      frame.mutable_register_()->set_protocol_version(frame.protocol_version());
    }
    OnRegister(conn, frame.register_());
    return;
  }
  if (frame.has_heartbeat()) {
    {
      absl::MutexLock lock(&mu_);
      auto it = workers_.find(conn->tag);
      if (it == workers_.end() || it->second->reg_conn != conn) return;  // Not (yet) registered.
      Worker& w = *it->second;
      w.stats = frame.heartbeat().stats();
      w.stats_time = w.last_heartbeat = options_.clock->Now();
      if (w.stats.draining() && !w.draining) LOG(INFO) << "worker " << w.reg.worker_id() << " is draining";
      w.draining = w.stats.draining();
      // A prefill (or colocated) worker says which dispatches its numbers
      // include; a decode worker hears of requests from prefills, so its
      // heartbeat is the newest the router knows of them.
      const bool decode = w.reg.role() == proto::ROLE_DECODE;
      while (!w.charges.empty() && (decode || w.charges.front().request_id <= w.stats.last_request_id())) {
        w.charges.pop_front();
      }
    }
    listener_->OnHeartbeat(conn->tag, frame.heartbeat().stats());
    return;
  }
  LOG(WARNING) << "unexpected frame (field " << frame.msg_case() << ") on the registration connection from "
               << conn->peer() << "; ignored";
}

void WorkerRegistry::Refuse(const rpc::ConnectionPtr& conn, const std::string& error) {
  LOG(WARNING) << "refusing worker registration from " << conn->peer() << ": " << error;
  proto::Frame reply = proto::NewFrame();
  reply.mutable_register_reply()->set_ok(false);
  reply.mutable_register_reply()->set_error(error);
  conn->Send(reply);
  // The worker closes on a refusal; the timer covers one that does not.
  auto timer = std::make_shared<asio::steady_timer>(io_);
  timer->expires_after(absl::ToChronoMilliseconds(options_.refuse_close_delay));
  timer->async_wait([timer, conn](boost::system::error_code) { conn->Close(); });
}

void WorkerRegistry::OnRegister(const rpc::ConnectionPtr& conn, const proto::Register& reg) {
  if (reg.protocol_version() != proto::PROTOCOL_VERSION_CURRENT) {
    return Refuse(conn, absl::StrCat("protocol version mismatch: the worker speaks version ",
                                     reg.protocol_version(), ", this router speaks version ",
                                     static_cast<int>(proto::PROTOCOL_VERSION_CURRENT)));
  }
  if (reg.worker_id().empty()) return Refuse(conn, "worker_id is empty");
  if (reg.role() != proto::ROLE_PREFILL && reg.role() != proto::ROLE_DECODE &&
      reg.role() != proto::ROLE_COLOCATED) {
    return Refuse(conn, absl::StrCat("worker ", reg.worker_id(), " has no valid role"));
  }
  if (reg.model() != options_.model) {
    return Refuse(conn, absl::StrCat("model mismatch: worker ", reg.worker_id(), " serves model \"",
                                     reg.model(), "\" but this router serves \"", options_.model, "\""));
  }
  if (auto hp = ParseHostPort(reg.control_address()); !hp.ok()) {
    return Refuse(conn, absl::StrCat("bad control_address: ", hp.status().message()));
  }
  WorkerPtr old;
  auto w = std::make_shared<Worker>();
  w->reg = reg;
  w->reg_conn = conn;
  w->stats.set_worker_id(reg.worker_id());
  w->stats.set_role(reg.role());
  w->stats.set_kv_blocks_total(reg.kv_blocks_total());
  w->stats.set_kv_blocks_free(reg.kv_blocks_total());
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    auto it = workers_.find(reg.worker_id());
    if (it != workers_.end()) old = it->second;
  }
  if (old) Remove(old, "the worker registered again");
  conn->tag = reg.worker_id();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    w->generation = next_generation_++;
    auto [known, fresh] = incarnations_.try_emplace(reg.worker_id(), reg.incarnation());
    w->restarted = !fresh && known->second != reg.incarnation();
    known->second = reg.incarnation();
    workers_[reg.worker_id()] = w;
    connect_queue_.push_back(w);
  }
  LOG(INFO) << "worker " << reg.worker_id() << " (" << RoleName(reg.role()) << ") registering from "
            << conn->peer() << "; connecting to " << reg.control_address();
}

void WorkerRegistry::ConnectorLoop() {
  while (true) {
    WorkerPtr w;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerRegistry* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
            return r->stopping_ || !r->connect_queue_.empty();
          },
          this));
      if (stopping_) return;
      w = connect_queue_.front();
      connect_queue_.pop_front();
      if (w->removed) continue;
    }
    FinishConnect(w);
  }
}

void WorkerRegistry::FinishConnect(const WorkerPtr& w) {
  const std::string& id = w->reg.worker_id();
  auto conn = rpc::Connect(io_, w->reg.control_address(), options_.connect_timeout);
  if (!conn.ok()) {
    bool current;
    {
      absl::MutexLock lock(&mu_);
      current = !w->removed;
    }
    if (current) {
      // Refuse closes the registration connection once the reply is out;
      // closing it here too could cut the reply off.
      Refuse(w->reg_conn, absl::StrCat("the router cannot connect to control_address ",
                                       w->reg.control_address(), ": ", conn.status().message()));
      Remove(w, "unreachable", /*close=*/false);
    }
    return;
  }
  std::shared_ptr<Life> life = life_;
  std::weak_ptr<Worker> weak = w;
  (*conn)->tag = id;
  (*conn)->Start({
      .on_frame =
          [life, weak](const rpc::ConnectionPtr&, proto::Frame frame) {
            WorkerPtr w = weak.lock();
            if (!w) return;
            life->With([&](WorkerRegistry* self) { self->OnWorkerConnFrame(w, std::move(frame)); });
          },
      .on_close =
          [life, weak](const rpc::ConnectionPtr&, const absl::Status& status) {
            WorkerPtr w = weak.lock();
            if (!w) return;
            life->With([&](WorkerRegistry* self) {
              self->Remove(w, absl::StrCat("connection to the worker closed: ", status.message()));
            });
          },
  });
  // The greeting tells the worker this connection is the router's.
  proto::Frame greeting = proto::NewFrame();
  greeting.mutable_register_reply()->set_ok(true);
  greeting.mutable_register_reply()->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  (*conn)->Send(greeting);
  {
    absl::MutexLock lock(&mu_);
    if (w->removed || stopping_) {
      CloseLater(io_, *conn);
      return;
    }
    w->conn = *conn;
    w->live = true;
    w->last_heartbeat = options_.clock->Now();
    if (w->stats_time == absl::Time()) w->stats_time = w->last_heartbeat;
  }
  // Same reply on the registration connection: the worker now heartbeats.
  w->reg_conn->Send(greeting);
  LOG(INFO) << "worker " << id << " (" << RoleName(w->reg.role()) << ") is live at "
            << w->reg.control_address();
  listener_->OnWorkerLive(id, w->reg.role(), w->restarted);
}

void WorkerRegistry::OnWorkerConnFrame(const WorkerPtr& w, proto::Frame frame) {
  if (frame.has_stats()) {
    absl::MutexLock lock(&mu_);
    if (w->removed) return;
    w->stats = frame.stats();
    w->stats_time = options_.clock->Now();
  } else if (frame.has_register_reply() || frame.has_register_() || frame.has_heartbeat()) {
    return;  // Not events; nothing for the listener.
  }
  {
    absl::MutexLock lock(&mu_);
    if (w->removed || !w->live) return;
  }
  listener_->OnWorkerFrame(w->reg.worker_id(), std::move(frame));
}

void WorkerRegistry::Remove(const WorkerPtr& w, const std::string& reason, bool close) {
  bool was_live;
  rpc::ConnectionPtr reg_conn, conn;
  {
    absl::MutexLock lock(&mu_);
    if (w->removed) return;
    w->removed = true;
    was_live = w->live;
    w->live = false;
    auto it = workers_.find(w->reg.worker_id());
    if (it != workers_.end() && it->second == w) workers_.erase(it);
    reg_conn = std::move(w->reg_conn);
    conn = std::move(w->conn);
  }
  if (close) {
    CloseLater(io_, reg_conn);
    CloseLater(io_, conn);
  }
  if (was_live) {
    LOG(WARNING) << "worker " << w->reg.worker_id() << " (" << RoleName(w->reg.role())
                 << ") removed: " << reason;
    listener_->OnWorkerLost(w->reg.worker_id(), w->reg.role(), reason);
  }
}

bool WorkerRegistry::Send(const std::string& worker_id, const proto::Frame& frame) {
  rpc::ConnectionPtr conn;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || !it->second->live) return false;
    conn = it->second->conn;
  }
  conn->Send(frame);
  return true;
}

std::vector<dispatch::WorkerLoad> WorkerRegistry::LiveLoads() const {
  std::vector<dispatch::WorkerLoad> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    if (!w->live || w->draining) continue;
    dispatch::WorkerLoad load{
        .id = id,
        .role = DispatchRole(w->reg.role()),
        .control_address = w->reg.control_address(),
        .queued_prefill_tokens = w->prefilling_tokens,
        .kv_blocks_free = w->stats.kv_blocks_free(),
        .running_requests = w->stats.running_requests(),
    };
    for (const PendingCharge& c : w->charges) {
      load.kv_blocks_free -= c.blocks;
      load.running_requests += c.requests;
    }
    out.push_back(std::move(load));
  }
  return out;
}

std::vector<WorkerSnapshot> WorkerRegistry::Snapshot() const {
  std::vector<WorkerSnapshot> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    if (!w->live) continue;
    out.push_back(WorkerSnapshot{.id = id,
                                 .role = w->reg.role(),
                                 .control_address = w->reg.control_address(),
                                 .metrics_port = w->reg.metrics_port(),
                                 .max_model_len = w->reg.max_model_len(),
                                 .block_size = w->reg.layout().block_size(),
                                 .stats = w->stats,
                                 .stats_time = w->stats_time,
                                 .dispatched = w->dispatched,
                                 .draining = w->draining,
                                 .flex = w->reg.flex()});
  }
  return out;
}

WorkerRegistry::Charged WorkerRegistry::Charge(const dispatch::Assignment& a, int64_t tokens, uint64_t request_id) {
  absl::MutexLock lock(&mu_);
  Charged out;
  if (auto it = workers_.find(a.prefill_id); it != workers_.end()) {
    out = {.prefill_id = a.prefill_id, .request_id = request_id};
    Worker& w = *it->second;
    const int64_t charge = a.prefill_tokens >= 0 ? a.prefill_tokens : tokens;
    if (w.prefilling.emplace(request_id, charge).second) w.prefilling_tokens += charge;  // Ids are per attempt.
    w.dispatched += 1;
  }
  if (auto it = workers_.find(a.decode_id); it != workers_.end()) {
    Worker& w = *it->second;
    const int64_t block = std::max<int64_t>(1, w.reg.layout().block_size() > 0 ? w.reg.layout().block_size() : 16);
    // With room for the first token.
    w.charges.push_back({.request_id = request_id, .blocks = (tokens + 1 + block - 1) / block, .requests = 1});
    if (a.decode_id != a.prefill_id) w.dispatched += 1;
  }
  return out;
}

void WorkerRegistry::Uncharge(const Charged& c) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(c.prefill_id);
  if (it == workers_.end()) return;
  Worker& w = *it->second;
  // Its blocks stay until counted.
  if (auto entry = w.prefilling.find(c.request_id); entry != w.prefilling.end()) {
    w.prefilling_tokens -= entry->second;
    w.prefilling.erase(entry);
  }
}

void WorkerRegistry::CheckHeartbeats() {
  const absl::Time now = options_.clock->Now();
  const absl::Duration limit = options_.heartbeat_interval * options_.missed_heartbeats;
  std::vector<std::pair<WorkerPtr, absl::Duration>> overdue;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, w] : workers_) {
      if (w->live && now - w->last_heartbeat > limit) overdue.emplace_back(w, now - w->last_heartbeat);
    }
  }
  for (auto& [w, silence] : overdue) {
    Remove(w, absl::StrCat("no heartbeat for ", absl::FormatDuration(silence), " (limit ",
                           absl::FormatDuration(limit), ")"));
  }
}

}  // namespace duet::router

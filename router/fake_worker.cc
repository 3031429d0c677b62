#include "router/fake_worker.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/frame.h"

namespace duet::router::testing {

struct FakeWorker::State {
  State(IoThread& io, FakeWorkerOptions o) : io(io), options(std::move(o)) {}
  IoThread& io;
  const FakeWorkerOptions options;
  std::unique_ptr<rpc::Server> server;
  std::string address;

  // Held (shared) while on_frame runs; the FakeWorker's destructor takes it
  // exclusively to clear `owner`, so a hook never outlives its FakeWorker.
  absl::Mutex hook_mu;
  FakeWorker* owner ABSL_GUARDED_BY(hook_mu) = nullptr;

  absl::Mutex mu;
  rpc::ConnectionPtr reg_conn ABSL_GUARDED_BY(mu);
  rpc::ConnectionPtr router_conn ABSL_GUARDED_BY(mu);
  std::vector<rpc::ConnectionPtr> accepted ABSL_GUARDED_BY(mu);
  bool reg_closed ABSL_GUARDED_BY(mu) = false;
  bool router_closed ABSL_GUARDED_BY(mu) = false;
  bool have_reply ABSL_GUARDED_BY(mu) = false;
  proto::RegisterReply reply ABSL_GUARDED_BY(mu);
  std::deque<proto::Frame> queue ABSL_GUARDED_BY(mu);
  std::vector<proto::Frame> all ABSL_GUARDED_BY(mu);
};

FakeWorker::FakeWorker(IoThread& io, FakeWorkerOptions options)
    : state_(std::make_shared<State>(io, std::move(options))) {
  {
    absl::MutexLock lock(&state_->hook_mu);
    state_->owner = this;
  }
  // Handlers hold the state weakly: the state holds the connections, and a
  // cycle would leak them when the io thread stops before they close.
  std::weak_ptr<State> weak = state_;
  auto server = rpc::Server::Listen(io.context(), "127.0.0.1:0", [weak](rpc::ConnectionPtr c) {
    std::shared_ptr<State> st = weak.lock();
    if (!st) return c->Close();
    {
      absl::MutexLock lock(&st->mu);
      st->accepted.push_back(c);
    }
    c->Start({
        .on_frame =
            [weak](const rpc::ConnectionPtr& c, proto::Frame f) {
              std::shared_ptr<State> st = weak.lock();
              if (!st) return;
              {
                absl::MutexLock lock(&st->mu);
                if (f.has_register_reply()) {
                  st->router_conn = c;
                  return;
                }
                st->all.push_back(f);
                // The router asks every live prefill for its cache's snapshot;
                // a fake has no cache (WaitFor still sees the ask).
                if (f.has_cache_snapshot_request()) return;
              }
              {
                absl::ReaderMutexLock lock(&st->hook_mu);
                if (st->owner == nullptr) return;
                if (st->owner->on_frame && st->owner->on_frame(*st->owner, f)) return;
              }
              absl::MutexLock lock(&st->mu);
              st->queue.push_back(std::move(f));
            },
        .on_close =
            [weak](const rpc::ConnectionPtr& c, const absl::Status&) {
              std::shared_ptr<State> st = weak.lock();
              if (!st) return;
              absl::MutexLock lock(&st->mu);
              if (c == st->router_conn) st->router_closed = true;
            },
    });
  });
  if (server.ok()) {
    state_->server = std::move(*server);
    state_->address = state_->server->address();
  }
}

FakeWorker::~FakeWorker() {
  {
    absl::MutexLock lock(&state_->hook_mu);
    state_->owner = nullptr;
  }
  // Connections are left for the router (or the io thread's end) to close:
  // closing one right after a Send races rpc::Connection's write completion
  // (a completion that lands after Close pops an already cleared queue).
  if (state_->server) state_->server->Stop();
}

const std::string& FakeWorker::control_address() const { return state_->address; }

absl::StatusOr<proto::RegisterReply> FakeWorker::Register(const std::string& router_address) {
  State& s = *state_;
  if (!s.server) return absl::InternalError("the fake worker could not listen");
  auto conn = rpc::Connect(s.io.context(), router_address, absl::Seconds(5));
  if (!conn.ok()) return conn.status();
  {
    absl::MutexLock lock(&s.mu);
    s.reg_conn = *conn;
  }
  std::weak_ptr<State> weak = state_;
  (*conn)->Start({
      .on_frame =
          [weak](const rpc::ConnectionPtr&, proto::Frame f) {
            std::shared_ptr<State> st = weak.lock();
            if (!st || !f.has_register_reply()) return;
            absl::MutexLock lock(&st->mu);
            st->reply = f.register_reply();
            st->have_reply = true;
          },
      .on_close =
          [weak](const rpc::ConnectionPtr&, const absl::Status&) {
            std::shared_ptr<State> st = weak.lock();
            if (!st) return;
            absl::MutexLock lock(&st->mu);
            st->reg_closed = true;
          },
  });
  proto::Frame reg = proto::NewFrame();
  auto* r = reg.mutable_register_();
  r->set_protocol_version(s.options.protocol_version);
  r->set_worker_id(s.options.id);
  r->set_role(s.options.role);
  r->set_model(s.options.model);
  r->set_control_address(s.options.control_address.empty() ? s.address : s.options.control_address);
  r->set_kv_blocks_total(s.options.kv_blocks_total);
  r->set_incarnation(s.options.incarnation);
  r->mutable_layout()->set_block_size(16);
  r->set_max_model_len(1024);
  (*conn)->Send(reg);
  absl::MutexLock lock(&s.mu);
  auto done = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.have_reply || s.reg_closed; };
  if (!s.mu.AwaitWithTimeout(absl::Condition(&done), kWaitLimit)) {
    return absl::DeadlineExceededError("no RegisterReply");
  }
  if (!s.have_reply) return absl::UnavailableError("the router closed the registration connection");
  return s.reply;
}

bool FakeWorker::WaitGreeting() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto done = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.router_conn != nullptr; };
  return s.mu.AwaitWithTimeout(absl::Condition(&done), kWaitLimit);
}

void FakeWorker::Heartbeat(const proto::WorkerStats& stats) {
  proto::Frame f = proto::NewFrame();
  *f.mutable_heartbeat()->mutable_stats() = stats;
  absl::MutexLock lock(&state_->mu);
  if (state_->reg_conn) state_->reg_conn->Send(f);
}

void FakeWorker::Send(const proto::Frame& frame) {
  absl::MutexLock lock(&state_->mu);
  if (state_->router_conn) state_->router_conn->Send(frame);
}

absl::StatusOr<proto::Frame> FakeWorker::NextFrame() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto ready = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return !s.queue.empty(); };
  if (!s.mu.AwaitWithTimeout(absl::Condition(&ready), kWaitLimit)) {
    return absl::DeadlineExceededError(absl::StrCat("worker ", s.options.id, ": no frame from the router"));
  }
  proto::Frame f = std::move(s.queue.front());
  s.queue.pop_front();
  return f;
}

absl::StatusOr<proto::Frame> FakeWorker::WaitFor(std::function<bool(const proto::Frame&)> pred) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  const proto::Frame* found = nullptr;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    for (const proto::Frame& f : s.all) {
      if (pred(f)) {
        found = &f;
        return true;
      }
    }
    return false;
  };
  if (!s.mu.AwaitWithTimeout(absl::Condition(&ready), kWaitLimit)) {
    return absl::DeadlineExceededError(absl::StrCat("worker ", s.options.id, ": the awaited frame never came"));
  }
  return *found;
}

void FakeWorker::CloseRouterConnection() {
  absl::MutexLock lock(&state_->mu);
  if (state_->router_conn) state_->router_conn->Close();
}

void FakeWorker::CloseRegistration() {
  absl::MutexLock lock(&state_->mu);
  if (state_->reg_conn) state_->reg_conn->Close();
}

void FakeWorker::Kill() {
  // Only the registration connection (it carries no frames under a test's
  // FakeClock): the router sees the worker gone and closes its own
  // connection, which this side then reads as closed. Closing a connection
  // right after a Send races rpc::Connection's write completion.
  CloseRegistration();
  if (state_->server) state_->server->Stop();
}

bool FakeWorker::WaitRegistrationClosed() {
  absl::MutexLock lock(&state_->mu);
  return state_->mu.AwaitWithTimeout(absl::Condition(&state_->reg_closed), kWaitLimit);
}

bool FakeWorker::WaitRouterConnectionClosed() {
  absl::MutexLock lock(&state_->mu);
  return state_->mu.AwaitWithTimeout(absl::Condition(&state_->router_closed), kWaitLimit);
}

proto::Frame FirstTokenFrame(uint64_t id, int32_t token, const std::string& worker) {
  proto::Frame f = proto::NewFrame();
  f.mutable_first_token()->set_request_id(id);
  f.mutable_first_token()->mutable_token()->set_id(token);
  f.mutable_first_token()->mutable_token()->set_logprob(-0.25f);
  f.mutable_first_token()->set_worker_id(worker);
  return f;
}
proto::Frame TokenFrame(uint64_t id, int32_t token) {
  proto::Frame f = proto::NewFrame();
  auto* ev = f.mutable_tokens()->add_events();
  ev->set_request_id(id);
  ev->mutable_token()->set_id(token);
  ev->mutable_token()->set_logprob(-0.5f);
  return f;
}
proto::Frame FinishFrame(uint64_t id, proto::FinishReason reason, int error_code, std::string error) {
  proto::Frame f = proto::NewFrame();
  f.mutable_finish()->set_request_id(id);
  f.mutable_finish()->set_reason(reason);
  f.mutable_finish()->set_error_code(error_code);
  f.mutable_finish()->set_error(error);
  return f;
}

}  // namespace duet::router::testing

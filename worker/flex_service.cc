#include "worker/flex_service.h"

#include "base/logging.h"
#include "proto/frame.h"

namespace duet::worker {

using proto::RoleName;

absl::StatusOr<std::unique_ptr<FlexService>> FlexService::Create(FlexOptions options, WorkerRuntime* runtime) {
  if (options.initial != proto::ROLE_PREFILL && options.initial != proto::ROLE_DECODE) {
    return absl::InvalidArgumentError("a flex worker starts as prefill or decode");
  }
  if (!options.factory || options.weights == nullptr || runtime == nullptr) {
    return absl::InvalidArgumentError("a flex worker needs a role factory, its weights and a runtime");
  }
  std::unique_ptr<FlexService> s(new FlexService(std::move(options), runtime));
  auto inner = s->o_.factory(s->o_.initial, s->o_.weights);
  if (!inner.ok()) return inner.status();
  absl::MutexLock lock(&s->mu_);
  s->inner_ = std::move(*inner);
  s->role_ = s->o_.initial;
  return s;
}

FlexService::~FlexService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (switcher_.joinable()) switcher_.join();
}

RegistrationInfo FlexService::Registration() {
  absl::MutexLock lock(&mu_);
  RegistrationInfo info = inner_ != nullptr ? inner_->Registration() : RegistrationInfo{.role = role_};
  info.flex = true;
  return info;
}

void FlexService::OnFrame(const rpc::ConnectionPtr& from, proto::Frame frame) {
  if (frame.has_switch_role()) {
    const proto::Role to = frame.switch_role().role();
    absl::MutexLock lock(&mu_);
    if ((to != proto::ROLE_PREFILL && to != proto::ROLE_DECODE) || to == role_ || switching_ || stopping_) {
      LOG(WARNING) << "flex worker " << runtime_->worker_id() << ": switch to role " << static_cast<int>(to)
                   << " ignored (serving " << RoleName(role_) << (switching_ ? ", switching" : "") << ")";
      return;
    }
    switching_ = true;
    // The new thread joins the last one (done, or about to be): the io
    // thread never waits.
    switcher_ = std::thread([this, to, last = std::move(switcher_)]() mutable {
      if (last.joinable()) last.join();
      Switch(to);
    });
    return;
  }
  absl::MutexLock lock(&mu_);
  if (inner_ == nullptr) {
    LOG(WARNING) << "flex worker " << runtime_->worker_id() << ": a frame while switching roles, dropped";
    return;
  }
  inner_->OnFrame(from, std::move(frame));
}

void FlexService::OnRouterLost() {
  absl::MutexLock lock(&mu_);
  if (inner_ != nullptr) inner_->OnRouterLost();
}

proto::WorkerStats FlexService::Stats() {
  absl::MutexLock lock(&mu_);
  return inner_ != nullptr ? inner_->Stats() : proto::WorkerStats();
}

proto::Role FlexService::role() const {
  absl::MutexLock lock(&mu_);
  return role_;
}

int FlexService::switches() const {
  absl::MutexLock lock(&mu_);
  return switches_;
}

void FlexService::Switch(proto::Role to) {
  const std::string id = runtime_->worker_id();
  proto::Role from;
  {
    absl::MutexLock lock(&mu_);
    from = role_;
  }
  LOG(INFO) << "flex worker " << id << ": draining " << RoleName(from) << " to serve " << RoleName(to);
  runtime_->Drain();
  // Idle (nothing queued, running or leased) for `settle` running, or the timeout.
  const absl::Time deadline = absl::Now() + o_.drain_timeout;
  absl::Time idle_since = absl::InfiniteFuture();
  while (absl::Now() < deadline) {
    if (!WorkerIdle(Stats())) {
      idle_since = absl::InfiniteFuture();
    } else if (idle_since == absl::InfiniteFuture()) {
      idle_since = absl::Now();
    } else if (absl::Now() - idle_since >= o_.settle) {
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;  // the process stops; its own drain takes over
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (absl::Now() >= deadline) {
    LOG(WARNING) << "flex worker " << id << ": " << RoleName(from) << " still busy after "
                 << absl::FormatDuration(o_.drain_timeout) << "; switching (the router migrates what is left)";
  }
  // The old role's pool and transport go before the new one's come.
  std::unique_ptr<WorkerService> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(inner_);
  }
  old.reset();
  absl::StatusOr<std::unique_ptr<WorkerService>> next = o_.factory(to, o_.weights);
  proto::Role now = to;
  if (!next.ok()) {
    LOG(ERROR) << "flex worker " << id << ": cannot start " << RoleName(to) << ": " << next.status() << "; back to "
               << RoleName(from);
    now = from;
    next = o_.factory(from, o_.weights);
  }
  if (!next.ok()) {
    LOG(ERROR) << "flex worker " << id << ": cannot start " << RoleName(from) << " again: " << next.status();
    if (o_.on_fatal) o_.on_fatal(next.status());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    inner_ = std::move(*next);
    role_ = now;
    switching_ = false;
    if (now == to) ++switches_;
  }
  runtime_->Reregister();
  LOG(INFO) << "flex worker " << id << ": serving " << RoleName(now) << ", registering again";
}

}  // namespace duet::worker

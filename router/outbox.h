// Outbox, one client's answer channel, and Pending, the outboxes a locked
// section touched, flushed after the lock is released: how the router answers
// clients in state-machine order without calling into a connection under its
// lock.
//
//   Pending p;                        // before the lock: flushes after it
//   { absl::MutexLock l(&mu_); out->Event(chunk); p.Add(out); }
#ifndef DUET_ROUTER_OUTBOX_H_
#define DUET_ROUTER_OUTBOX_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "http/server.h"

namespace duet::router {

// One client's answer channel. Ops are queued under the router's lock (so
// they are in state-machine order) and sent by Flush outside it (so no
// HttpExchange call ever runs under the lock). Whoever flushes first sends
// everything queued, including ops others queue meanwhile.
class Outbox {
 public:
  explicit Outbox(http::HttpExchangePtr ex) : ex_(std::move(ex)) {}

  void Reply(http::HttpResponse r) { Push(std::move(r)); }
  void StartStream() { Push(Start{}); }
  void Event(std::string data) { Push(std::move(data)); }
  void EndStream() { Push(End{}); }

  void Flush() {
    absl::MutexLock lock(&mu_);
    if (flushing_) return;
    flushing_ = true;
    while (!ops_.empty()) {
      Op op = std::move(ops_.front());
      ops_.pop_front();
      mu_.Unlock();
      Run(op);
      mu_.Lock();
    }
    flushing_ = false;
  }

  const http::HttpExchangePtr& exchange() const { return ex_; }

 private:
  struct Start {};
  struct End {};
  using Op = std::variant<http::HttpResponse, Start, std::string, End>;

  void Push(Op op) {
    absl::MutexLock lock(&mu_);
    ops_.push_back(std::move(op));
  }
  void Run(Op& op) {
    if (auto* r = std::get_if<http::HttpResponse>(&op)) {
      ex_->Reply(std::move(*r));
    } else if (std::holds_alternative<Start>(op)) {
      ex_->StartStream();
    } else if (auto* e = std::get_if<std::string>(&op)) {
      ex_->SendEvent(*e);
    } else {
      ex_->EndStream();
    }
  }

  const http::HttpExchangePtr ex_;
  absl::Mutex mu_;
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
};
using OutboxPtr = std::shared_ptr<Outbox>;

// Outboxes touched under the lock, flushed after it is released.
// Declare one before taking the lock: it flushes when it goes out of scope,
// after the lock's scope has ended.
class Pending {
 public:
  void Add(const OutboxPtr& out) { outs_.push_back(out); }
  void Flush() {
    for (auto& o : outs_) o->Flush();
    outs_.clear();
  }
  ~Pending() { Flush(); }

 private:
  std::vector<OutboxPtr> outs_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_OUTBOX_H_

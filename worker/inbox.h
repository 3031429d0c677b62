// Inbox: what other threads hand a worker's engine thread, applied there
// in the order posted (so a Cancel never overtakes its request). The one
// engine-thread queue of every role: the prefill service's events and the
// decode/colocated engine loop's commands.
//
//   Inbox<Event> inbox;
//   inbox.Post(e);                                          // any thread
//   std::vector<Event> batch;
//   while (inbox.Take(idle ? kPeriod : absl::ZeroDuration(), &batch)) { ... }   // the engine thread
//   inbox.Stop();                                           // Take returns false from then on
//
// Thread-safe.
#ifndef DUET_WORKER_INBOX_H_
#define DUET_WORKER_INBOX_H_

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet::worker {

template <typename T>
class Inbox {
 public:
  // False (and `item` dropped) once stopped.
  bool Post(T item) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Waits up to `wait` (none for zero, forever for an infinite duration)
  // until something was posted or Stop was called, then moves what was
  // posted into `out` (replacing its contents). False once stopped.
  bool Take(absl::Duration wait, std::vector<T>* out) {
    out->clear();
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || !items_.empty(); };
    if (wait > absl::ZeroDuration() && !ready()) mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
    if (stopped_) return false;
    out->swap(items_);
    return true;
  }

  // Take returns false from now on; false if it already did.
  bool Stop() {
    absl::MutexLock lock(&mu_);
    return !std::exchange(stopped_, true);
  }

  // What was posted and never taken (after Stop: for shutdown).
  std::vector<T> Drain() {
    absl::MutexLock lock(&mu_);
    return std::exchange(items_, {});
  }

 private:
  absl::Mutex mu_;
  std::vector<T> items_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_INBOX_H_

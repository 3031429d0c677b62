// Injectable time, so that leases, heartbeats and deadlines are testable
// without sleeping.
//
//   Clock* clock = RealClock();          // production
//   FakeClock fake; fake.Advance(absl::Seconds(5));  // tests
#ifndef DUET_BASE_CLOCK_H_
#define DUET_BASE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The system's monotonic-enough wall clock (absl::Now). Never null, never freed.
Clock* RealClock();

// A clock that moves only when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_;
};

}  // namespace duet

#endif  // DUET_BASE_CLOCK_H_

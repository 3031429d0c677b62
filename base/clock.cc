#include "base/clock.h"

#include "absl/time/clock.h"

namespace duet {
namespace {
class SystemClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
}  // namespace

Clock* RealClock() {
  static SystemClock* c = new SystemClock();
  return c;
}

}  // namespace duet

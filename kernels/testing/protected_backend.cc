#include "kernels/testing/protected_backend.h"

#include <algorithm>
#include <iterator>

#include "base/logging.h"
#include "kernels/guarded_memory.h"

namespace duet::kernels {

std::map<std::string, int64_t> ProtectedBackend::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

void ProtectedBackend::Call(const char* op, absl::FunctionRef<void()> run) {
  CHECK(std::find(std::begin(kOpNames), std::end(kOpNames), op) != std::end(kOpNames))
      << op << " is not in kernels::kOpNames";
  {
    absl::MutexLock lock(&mu_);
    ++calls_[op];
  }
  GuardWindow open;
  run();
}

}  // namespace duet::kernels

#include "kernels/testing/protected_backend.h"

#include <algorithm>
#include <vector>

#include "base/logging.h"
#include "kernels/guarded_memory.h"

namespace duet::kernels {

std::map<std::string, int64_t> ProtectedBackend::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

void ProtectedBackend::Call(const char* op, absl::FunctionRef<void()> run) {
  const std::vector<std::string>& names = OpNames();
  CHECK(std::find(names.begin(), names.end(), op) != names.end()) << op << " is not in ForwardingBackend::OpNames";
  {
    absl::MutexLock lock(&mu_);
    ++calls_[op];
  }
  GuardWindow open;
  run();
}

}  // namespace duet::kernels

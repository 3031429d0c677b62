#include "kernels/testing/protected_backend.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace duet::kernels {
namespace {

// Every protected buffer's pages and the count of ops and copies running.
struct Domain {
  absl::Mutex mu;
  int open ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::pair<void*, size_t>> regions ABSL_GUARDED_BY(mu);
};

Domain& TheDomain() {
  static Domain* d = new Domain();
  return *d;
}

void Protect(void* at, size_t bytes, int prot) {
  CHECK_EQ(mprotect(at, bytes, prot), 0) << "mprotect: " << std::strerror(errno);
}

// A fault names the address and the rule, then dies as a fault does.
void OnFault(int sig, siginfo_t* info, void*) {
  char msg[160];
  const int n = std::snprintf(msg, sizeof(msg),
                              "protected backend: memory at %p touched outside an op (a backend buffer read or "
                              "written by host code)\n",
                              info->si_addr);
  if (n > 0) (void)!write(STDERR_FILENO, msg, static_cast<size_t>(n));
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallFaultHandler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnFault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

// Opens the domain's pages for as long as it lives.
class Open {
 public:
  Open() {
    Domain& d = TheDomain();
    absl::MutexLock lock(&d.mu);
    if (d.open++ == 0) {
      for (const auto& [at, bytes] : d.regions) Protect(at, bytes, PROT_READ | PROT_WRITE);
    }
  }
  ~Open() {
    Domain& d = TheDomain();
    absl::MutexLock lock(&d.mu);
    if (--d.open == 0) {
      for (const auto& [at, bytes] : d.regions) Protect(at, bytes, PROT_NONE);
    }
  }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;
};

class ProtectedBuffer final : public HostAddressedBuffer {
 public:
  ProtectedBuffer(const BufferType* type, void* memory, size_t mapped, int64_t bytes, std::string name)
      : type_(type), memory_(memory), mapped_(mapped), bytes_(bytes), name_(std::move(name)) {}
  ~ProtectedBuffer() override {
    Domain& d = TheDomain();
    absl::MutexLock lock(&d.mu);
    d.regions.erase(std::find(d.regions.begin(), d.regions.end(), std::make_pair(memory_, mapped_)));
    munmap(memory_, mapped_);
  }

  const BufferType& type() const override { return *type_; }
  int64_t bytes() const override { return bytes_; }
  const std::string& name() const override { return name_; }
  void* base() const override { return memory_; }

 protected:
  void Access(absl::FunctionRef<void()> copy) const override {
    Open open;
    copy();
  }

 private:
  const BufferType* const type_;
  void* const memory_;
  const size_t mapped_;
  const int64_t bytes_;
  const std::string name_;
};

class ProtectedType final : public BufferType {
 public:
  std::string Name() const override { return "protected host"; }
  bool IsHost() const override { return true; }
  absl::StatusOr<BufferPtr> Allocate(int64_t bytes, const std::string& name) override {
    if (bytes <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": a buffer of ", bytes, " bytes"));
    InstallFaultHandler();
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t mapped = (static_cast<size_t>(bytes) + page - 1) / page * page;
    Domain& d = TheDomain();
    absl::MutexLock lock(&d.mu);
    void* memory = mmap(nullptr, mapped, d.open > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(name, ": mmap of ", mapped, " bytes: ", std::strerror(errno)));
    }
    d.regions.emplace_back(memory, mapped);
    return std::make_unique<ProtectedBuffer>(this, memory, mapped, bytes, name);
  }
};

}  // namespace

BufferType& ProtectedMemoryType() {
  static ProtectedType* type = new ProtectedType();
  return *type;
}

bool ProtectedMemoryClosed() {
  Domain& d = TheDomain();
  absl::MutexLock lock(&d.mu);
  return d.open == 0;
}

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
  Open open;
  run();
}

}  // namespace duet::kernels

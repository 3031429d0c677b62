#include "kernels/guarded_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"

namespace duet::kernels {
namespace {

// Every guarded buffer's pages and the count of open windows.
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
  char msg[200];
  const int n = std::snprintf(msg, sizeof(msg),
                              "guarded memory: %p touched outside an op or a copy (backend or device memory read "
                              "or written by host code)\n",
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

class GuardedBuffer final : public HostAddressedBuffer {
 public:
  GuardedBuffer(const BufferType* type, void* memory, size_t mapped, int64_t bytes, std::string name)
      : type_(type), memory_(memory), mapped_(mapped), bytes_(bytes), name_(std::move(name)) {}
  ~GuardedBuffer() override {
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
    GuardWindow open;
    copy();
  }

 private:
  const BufferType* const type_;
  void* const memory_;
  const size_t mapped_;
  const int64_t bytes_;
  const std::string name_;
};

class GuardedType final : public BufferType {
 public:
  std::string Name() const override { return "guarded host"; }
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
    return std::make_unique<GuardedBuffer>(this, memory, mapped, bytes, name);
  }
};

}  // namespace

GuardWindow::GuardWindow() {
  Domain& d = TheDomain();
  absl::MutexLock lock(&d.mu);
  if (d.open++ == 0) {
    for (const auto& [at, bytes] : d.regions) Protect(at, bytes, PROT_READ | PROT_WRITE);
  }
}

GuardWindow::~GuardWindow() {
  Domain& d = TheDomain();
  absl::MutexLock lock(&d.mu);
  if (--d.open == 0) {
    for (const auto& [at, bytes] : d.regions) Protect(at, bytes, PROT_NONE);
  }
}

BufferType& GuardedMemoryType() {
  static GuardedType* type = new GuardedType();
  return *type;
}

bool GuardedMemoryClosed() {
  Domain& d = TheDomain();
  absl::MutexLock lock(&d.mu);
  return d.open == 0;
}

}  // namespace duet::kernels

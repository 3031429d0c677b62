#include "kvtransfer/cuda_ipc/test_peer.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace duet::kvtransfer::gpu_testing {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool Executable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

std::string SelfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

// Waits for pid for up to `timeout` without sleeping: a pidfd is pollable.
absl::StatusOr<int> WaitPid(pid_t pid, absl::Duration timeout) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == pid) return status;
  if (r < 0) return Errno("waitpid");
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    int ready = poll(&p, 1, ms);
    close(pidfd);
    if (ready == 0) return absl::DeadlineExceededError(absl::StrCat("pid ", pid, " still running"));
  }
  // pidfd_open is missing on old kernels: fall back to a blocking wait.
  r = waitpid(pid, &status, 0);
  if (r < 0) return Errno("waitpid");
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return Errno("pipe2");
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return Errno("pipe2");
  }
  std::vector<std::string> argv_storage = {path};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) return Errno("fork");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec (the parent may hold
    // CUDA and abseil state that must not be touched here).
    dup2(in_pipe[0], STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    execv(path.c_str(), argv.data());
    const char msg[] = "test_peer: execv failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  signal(SIGPIPE, SIG_IGN);  // A dead peer must surface as an error, not kill the test.
  return std::unique_ptr<PeerProcess>(new PeerProcess(pid, in_pipe[1], out_pipe[0]));
}

PeerProcess::~PeerProcess() {
  if (to_child_ >= 0) close(to_child_);
  to_child_ = -1;
  if (!reaped_) {
    absl::StatusOr<int> status = WaitPid(pid_, absl::Seconds(10));
    if (!status.ok()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  close(from_child_);
}

absl::StatusOr<std::string> PeerProcess::ReadLine(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("peer ", pid_, " sent no line in ", absl::FormatDuration(timeout)));
    }
    pollfd p{from_child_, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(ms));
    if (ready < 0 && errno != EINTR) return Errno("poll");
    if (ready <= 0) continue;
    char chunk[4096];
    ssize_t n = read(from_child_, chunk, sizeof(chunk));
    if (n < 0 && errno != EINTR) return Errno("read");
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("peer ", pid_, " closed its stdout (exited?)",
                       buffer_.empty() ? "" : "; partial line: ", buffer_));
    }
    if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
  }
}

absl::Status PeerProcess::WriteLine(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(to_child_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("write to peer: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PeerProcess::CloseAndWait(absl::Duration timeout) {
  if (to_child_ >= 0) close(to_child_);
  to_child_ = -1;
  if (reaped_) return absl::FailedPreconditionError("peer already reaped");
  absl::StatusOr<int> status = WaitPid(pid_, timeout);
  if (status.ok()) reaped_ = true;
  return status;
}

absl::StatusOr<std::string> FindPeerBinary(const std::string& env_var,
                                           const std::string& workspace_path) {
  std::vector<std::string> tried;
  auto try_path = [&](const std::string& p) {
    tried.push_back(p);
    return Executable(p);
  };
  if (const char* env = std::getenv(env_var.c_str()); env != nullptr && *env != '\0') {
    if (try_path(env)) return std::string(env);
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    std::string p =
        absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "duet", "/", workspace_path);
    if (try_path(p)) return p;
  }
  std::string self = SelfPath();
  if (!self.empty()) {
    std::string p = absl::StrCat(self, ".runfiles/duet/", workspace_path);
    if (try_path(p)) return p;
    std::string dir = self.substr(0, self.rfind('/'));
    std::string base = workspace_path.substr(workspace_path.rfind('/') + 1);
    p = absl::StrCat(dir, "/", base);
    if (try_path(p)) return p;
  }
  return absl::NotFoundError(absl::StrCat("peer binary ", workspace_path, " not found; tried: ",
                                          absl::StrJoin(tried, ", "), " (set ", env_var, ")"));
}

std::vector<uint32_t> PatternWords(uint64_t seed, uint64_t first_word, size_t num_words) {
  std::vector<uint32_t> out(num_words);
  for (size_t i = 0; i < num_words; ++i) out[i] = PatternWord(seed, first_word + i);
  return out;
}

}  // namespace duet::kvtransfer::gpu_testing

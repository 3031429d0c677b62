#include "base/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace duet {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::vector<std::string>& env,
                                                              const std::string& log_path,
                                                              const std::vector<int>& cpus) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child needs is built before fork: only async-signal-safe
  // calls happen between fork and exec.
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& o : env) overridden |= o.substr(0, o.find('=')) == name;
    if (!overridden) envs.push_back(entry);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // A pipe closed on exec tells the parent whether exec succeeded.
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    if (log_fd >= 0) close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  pid_t pid = fork();
  if (pid < 0) {
    if (log_fd >= 0) close(log_fd);
    close(status_pipe[0]);
    close(status_pipe[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (!cpus.empty()) sched_setaffinity(0, sizeof(set), &set);
    execve(cargv[0], cargv.data(), cenv.data());
    int err = errno;
    (void)!write(status_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  close(status_pipe[1]);
  if (log_fd >= 0) close(log_fd);
  int child_err = 0;
  ssize_t n = read(status_pipe[0], &child_err, sizeof(child_err));
  close(status_pipe[0]);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  p->log_path_ = log_path;
  p->name_ = argv[0];
  if (n == sizeof(child_err)) {
    p->Wait();
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", strerror(child_err)));
  }
  return p;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

absl::Status Subprocess::Signal(int sig) {
  if (exited_) return absl::FailedPreconditionError(absl::StrCat(name_, " has exited"));
  if (kill(pid_, sig) != 0) return absl::InternalError(absl::StrCat("kill: ", strerror(errno)));
  return absl::OkStatus();
}

std::optional<int> Subprocess::TryWait() {
  if (exited_) return status_;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = st;
    return st;
  }
  return std::nullopt;
}

int Subprocess::Wait() {
  if (exited_) return status_;
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
  status_ = st;
  return st;
}

int Subprocess::Terminate(absl::Duration grace) {
  if (exited_) return status_;
  kill(pid_, SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  // Reaping has no timed wait; poll the child at a short interval until the deadline.
  while (absl::Now() < deadline) {
    if (auto st = TryWait()) return *st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  return Wait();
}

std::string DescribeExit(int st) {
  if (WIFEXITED(st)) return absl::StrCat("exited with code ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return absl::StrCat("killed by signal ", WTERMSIG(st), " (", strsignal(WTERMSIG(st)), ")");
  return "ended";
}

}  // namespace duet

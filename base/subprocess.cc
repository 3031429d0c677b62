#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
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
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::vector<std::string>& env,
                                                              const std::string& log_path,
                                                              const std::vector<int>& cpus) {
  return Launch(argv, env, log_path, cpus, /*pipes=*/false, /*merge_stderr=*/false);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::StartWithPipes(const std::vector<std::string>& argv,
                                                                       const std::vector<std::string>& env,
                                                                       bool merge_stderr, const std::vector<int>& cpus) {
  return Launch(argv, env, "", cpus, /*pipes=*/true, merge_stderr);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Launch(const std::vector<std::string>& argv,
                                                               const std::vector<std::string>& env,
                                                               const std::string& log_path,
                                                               const std::vector<int>& cpus, bool pipes,
                                                               bool merge_stderr) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  // A write to a child that died must be an error, not a fatal signal.
  if (pipes) signal(SIGPIPE, SIG_IGN);
  // Everything the child needs is built before fork: only async-signal-safe
  // calls happen between fork and exec (the $PATH search of execvpe included).
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& o : env) overridden |= o.substr(0, o.find('=')) == name;
    if (!overridden) envs.push_back(entry);
  }
  for (const auto& o : env) {
    if (o.find('=') != std::string::npos) envs.push_back(o);  // A bare NAME only removes it.
  }
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return Errno(absl::StrCat("cannot open ", log_path));
  }
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  auto close_all = [&] {
    CloseFd(log_fd);
    for (int* fd : {&in[0], &in[1], &out[0], &out[1]}) CloseFd(*fd);
  };
  if (pipes && (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)) {
    absl::Status s = Errno("pipe2");
    close_all();
    return s;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // A pipe closed on exec tells the parent whether exec succeeded.
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    absl::Status s = Errno("pipe2");
    close_all();
    return s;
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    absl::Status s = Errno("fork");
    close_all();
    close(status_pipe[0]);
    close(status_pipe[1]);
    return s;
  }
  if (pid == 0) {
    setpgid(0, 0);
    // Dies with its starter; a starter already gone before this line is
    // seen by the parent pid having changed.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    if (pipes) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      if (merge_stderr) dup2(out[1], STDERR_FILENO);
    } else {
      if (log_fd >= 0) {
        dup2(log_fd, STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
      }
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    }
    if (!cpus.empty()) sched_setaffinity(0, sizeof(set), &set);
    execvpe(cargv[0], cargv.data(), cenv.data());
    int err = errno;
    (void)!write(status_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  close(status_pipe[1]);
  CloseFd(log_fd);
  CloseFd(in[0]);
  CloseFd(out[1]);
  int child_err = 0;
  ssize_t n = read(status_pipe[0], &child_err, sizeof(child_err));
  close(status_pipe[0]);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  p->to_child_ = in[1];
  p->from_child_ = out[0];
  p->log_path_ = log_path;
  p->name_ = argv[0];
  if (n == sizeof(child_err)) {
    p->Wait();
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", strerror(child_err)));
  }
  return p;
}

Subprocess::~Subprocess() {
  CloseFd(to_child_);
  CloseFd(from_child_);
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

absl::Status Subprocess::NeedPipes() const {
  if (from_child_ < 0 && to_child_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " has no pipes (use StartWithPipes)"));
  }
  return absl::OkStatus();
}

absl::Status Subprocess::WriteLine(const std::string& line) {
  if (to_child_ < 0) return absl::FailedPreconditionError(absl::StrCat(name_, ": stdin is not a pipe or is closed"));
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(to_child_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("write to ", name_));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Subprocess::Fill(absl::Time deadline, absl::Duration timeout, const char* waiting_for) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat(waiting_for, " from ", name_, " (pid ", pid_, ") within ", absl::FormatDuration(timeout)));
    }
    struct pollfd fd = {from_child_, POLLIN, 0};
    const int r = poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;
    char buf[65536];
    const ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("read from ", name_));
    if (n == 0) {
      CloseFd(from_child_);
    } else {
      buffer_.append(buf, static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  if (absl::Status s = NeedPipes(); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (from_child_ < 0) {
      if (buffer_.empty()) return absl::UnavailableError(absl::StrCat(name_, " (pid ", pid_, ") closed its stdout"));
      std::string last;  // A last line without its newline.
      last.swap(buffer_);
      return last;
    }
    if (absl::Status s = Fill(deadline, timeout, "no line"); !s.ok()) return s;
  }
}

absl::StatusOr<std::string> Subprocess::Call(const std::string& line, absl::Duration timeout) {
  if (absl::Status s = WriteLine(line); !s.ok()) return s;
  return ReadLine(timeout);
}

absl::StatusOr<std::string> Subprocess::ReadToEnd(absl::Duration timeout) {
  if (absl::Status s = NeedPipes(); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  while (from_child_ >= 0) {
    if (absl::Status s = Fill(deadline, timeout, "no end of output"); !s.ok()) return s;
  }
  std::string out;
  out.swap(buffer_);
  return out;
}

void Subprocess::CloseStdin() { CloseFd(to_child_); }

absl::Status Subprocess::Signal(int sig) {
  if (exited_) return absl::FailedPreconditionError(absl::StrCat(name_, " has exited"));
  if (kill(pid_, sig) != 0) return Errno("kill");
  return absl::OkStatus();
}

absl::Status Subprocess::SignalAndAwait(int sig, int wait_flag, bool (*reached)(int), const char* what) {
  if (absl::Status s = Signal(sig); !s.ok()) return s;
  int st = 0;
  while (waitpid(pid_, &st, wait_flag) < 0) {
    if (errno != EINTR) return Errno("waitpid");
  }
  if (!reached(st)) return absl::InternalError(absl::StrCat(name_, " did not ", what));
  return absl::OkStatus();
}

absl::Status Subprocess::Stop() {
  return SignalAndAwait(SIGSTOP, WUNTRACED, [](int st) { return static_cast<bool>(WIFSTOPPED(st)); }, "stop");
}

absl::Status Subprocess::Continue() {
  return SignalAndAwait(SIGCONT, WCONTINUED, [](int st) { return static_cast<bool>(WIFCONTINUED(st)); }, "continue");
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

absl::StatusOr<int> Subprocess::WaitFor(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Reaping has no timed wait; poll the child at a short interval until the deadline.
  for (;;) {
    if (std::optional<int> st = TryWait()) return *st;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name_, " (pid ", pid_, ") still running after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int Subprocess::Terminate(absl::Duration grace, int sig) {
  if (exited_) return status_;
  kill(pid_, sig);
  if (absl::StatusOr<int> st = WaitFor(grace); st.ok()) return *st;
  kill(pid_, SIGKILL);
  return Wait();
}

std::string DescribeExit(int st) {
  if (WIFEXITED(st)) return absl::StrCat("exited with code ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return absl::StrCat("killed by signal ", WTERMSIG(st), " (", strsignal(WTERMSIG(st)), ")");
  return "ended";
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                                         const std::vector<std::string>& env) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::StartWithPipes(argv, env);
  if (!p.ok()) return p.status();
  (*p)->CloseStdin();
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> out = (*p)->ReadToEnd(timeout);
  if (!out.ok()) return out.status();  // The destructor kills the child.
  absl::StatusOr<int> st = (*p)->WaitFor(std::max(absl::ZeroDuration(), deadline - absl::Now()));
  if (!st.ok()) return st.status();
  return CommandResult{.status = *st, .output = std::move(*out)};
}

}  // namespace duet

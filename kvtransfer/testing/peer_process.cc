#include "kvtransfer/testing/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace duet::kvtransfer::testing {
namespace {
absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}
}  // namespace

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start(
    const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  // A write to a child that died must be an error, not a fatal signal.
  signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Errno("pipe2");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return Errno("pipe2");
  }
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    bool overridden = false;
    for (const std::string& o : env) {
      if (kv.compare(0, o.find('=') + 1, o, 0, o.find('=') + 1) == 0) overridden = true;
    }
    if (!overridden) envs.push_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  pid_t pid;
  int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
  }
  std::unique_ptr<PeerProcess> p(new PeerProcess());
  p->pid_ = pid;
  p->to_child_ = in[1];
  p->from_child_ = out[0];
  return p;
}

PeerProcess::~PeerProcess() {
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    Reap();
  }
}

absl::Status PeerProcess::Send(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(to_child_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write to peer");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerProcess::ReadLine(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no line from peer ", pid_, " within ", absl::FormatDuration(timeout)));
    }
    struct pollfd fd = {from_child_, POLLIN, 0};
    int r = poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;
    char buf[4096];
    ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("read from peer");
    if (n == 0) return absl::UnavailableError(absl::StrCat("peer ", pid_, " closed its stdout"));
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> PeerProcess::Call(const std::string& line, absl::Duration timeout) {
  absl::Status s = Send(line);
  if (!s.ok()) return s;
  return ReadLine(timeout);
}

absl::Status PeerProcess::Signal(int sig) {
  if (reaped_) return absl::FailedPreconditionError("peer already reaped");
  if (kill(pid_, sig) != 0) return Errno("kill");
  return absl::OkStatus();
}

absl::StatusOr<KvPeer> StartKvPeer(int32_t blocks, uint64_t block_bytes, uint64_t seed,
                                   const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {"kvtransfer/testing/kv_peer",
                                   absl::StrCat("--blocks=", blocks),
                                   absl::StrCat("--block-bytes=", block_bytes),
                                   absl::StrCat("--seed=", seed)};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto process = PeerProcess::Start(argv);
  if (!process.ok()) return process.status();
  KvPeer peer;
  peer.process = std::move(*process);
  for (const char* key : {"address", "region", "ready"}) {
    auto line = peer.process->ReadLine();
    if (!line.ok()) return line.status();
    std::string prefix = std::string(key);
    if (line->compare(0, prefix.size(), prefix) != 0) {
      return absl::InternalError(absl::StrCat("kv_peer: expected ", key, ", got: ", *line));
    }
    std::string hex = line->size() > prefix.size() ? line->substr(prefix.size() + 1) : "";
    if (prefix == "address") peer.address = absl::HexStringToBytes(hex);
    if (prefix == "region") peer.region = absl::HexStringToBytes(hex);
  }
  return peer;
}

absl::StatusOr<std::vector<uint64_t>> PeerEpochs(PeerProcess& peer,
                                                 const std::vector<int32_t>& blocks) {
  std::string cmd = "epochs";
  for (int32_t b : blocks) absl::StrAppend(&cmd, " ", b);
  auto line = peer.Call(cmd);
  if (!line.ok()) return line.status();
  std::vector<std::string> words = absl::StrSplit(*line, ' ');
  if (words.size() != blocks.size() + 1 || words[0] != "epochs") {
    return absl::InternalError(absl::StrCat("kv_peer: bad epochs reply: ", *line));
  }
  std::vector<uint64_t> epochs;
  for (size_t i = 1; i < words.size(); ++i) {
    uint64_t e;
    if (!absl::SimpleAtoi(words[i], &e)) return absl::InternalError("kv_peer: bad epoch");
    epochs.push_back(e);
  }
  return epochs;
}

absl::Status PeerProcess::Stop() {
  if (absl::Status s = Signal(SIGSTOP); !s.ok()) return s;
  int status = 0;
  while (waitpid(pid_, &status, WUNTRACED) < 0) {
    if (errno != EINTR) return Errno("waitpid");
  }
  if (!WIFSTOPPED(status)) return absl::InternalError("peer did not stop");
  return absl::OkStatus();
}

absl::Status PeerProcess::Continue() {
  if (absl::Status s = Signal(SIGCONT); !s.ok()) return s;
  int status = 0;
  while (waitpid(pid_, &status, WCONTINUED) < 0) {
    if (errno != EINTR) return Errno("waitpid");
  }
  if (!WIFCONTINUED(status)) return absl::InternalError("peer did not continue");
  return absl::OkStatus();
}

int PeerProcess::Reap() {
  if (reaped_) return 0;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return status;
}

}  // namespace duet::kvtransfer::testing

// Every child process duet starts: `duet up`'s cluster, the multi-process
// tests' peers and clusters, the benches' tools, and one-shot commands.
// Start with argv, env and a log file, or with pipes to talk to the child in
// lines; signal, stop and continue, and reap with or without a bound.
//
//   ASSIGN_OR_RETURN(auto p, Subprocess::Start({"bazel-bin/tools/duet", "router"}, {}, "/tmp/router.log"));
//   p->Signal(SIGTERM); int status = p->Wait();
//
//   ASSIGN_OR_RETURN(auto peer, Subprocess::StartWithPipes({"kvtransfer/testing/kv_peer", "--blocks=8"}));
//   ASSIGN_OR_RETURN(std::string reply, peer->Call("epochs 3"));
//
//   ASSIGN_OR_RETURN(CommandResult r, RunCommand({"/bin/sh", "-c", "promtool check metrics < m.txt"}));
//
// argv[0] without a slash is looked up on $PATH. With Start, the child's
// stdout and stderr go to `log_path` (appended), or are inherited when it is
// empty, and stdin is /dev/null; with StartWithPipes, stdin and stdout are
// pipes to this process and stderr is inherited. The child gets its own
// process group so a terminal's Ctrl-C reaches only the supervisor, which
// decides how to stop its children. A write to a child that exited is an
// error, not a SIGPIPE. Reads wait on the pipe with a bound, so a dead or
// silent child is an error, never a hang. The destructor SIGKILLs and reaps
// a child still running; a child also gets SIGKILL when its starter dies
// without running it (killed, say), so no worker outlives its cluster. That
// is Linux's parent-death signal, which follows the starting thread: start
// a child from a thread that outlives it. Not thread-safe: one owner.
#ifndef DUET_BASE_SUBPROCESS_H_
#define DUET_BASE_SUBPROCESS_H_

#include <sys/types.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet {

class Subprocess {
 public:
  // env entries "NAME=value" are added to (and override) this process's
  // environment; an entry "NAME" without '=' removes NAME. cpus, when
  // non-empty, pins the child to those cores.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::vector<std::string>& env,
                                                           const std::string& log_path,
                                                           const std::vector<int>& cpus = {});
  // merge_stderr: the child's stderr goes into the same pipe as its stdout.
  static absl::StatusOr<std::unique_ptr<Subprocess>> StartWithPipes(const std::vector<std::string>& argv,
                                                                    const std::vector<std::string>& env = {},
                                                                    bool merge_stderr = false,
                                                                    const std::vector<int>& cpus = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  // StartWithPipes only. One line (a newline is added) to the child's stdin.
  absl::Status WriteLine(const std::string& line);
  // The next line of the child's stdout, without its newline;
  // DeadlineExceeded after `timeout`, Unavailable once the child closed it.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout = absl::Seconds(30));
  // WriteLine, then ReadLine.
  absl::StatusOr<std::string> Call(const std::string& line, absl::Duration timeout = absl::Seconds(30));
  // Everything the child writes to stdout until it closes it.
  absl::StatusOr<std::string> ReadToEnd(absl::Duration timeout);
  // Closes the child's stdin (a peer that serves stdin exits on EOF).
  void CloseStdin();

  absl::Status Signal(int sig);
  // SIGSTOP, returning once the child is stopped; SIGCONT, returning once it runs again.
  absl::Status Stop();
  absl::Status Continue();
  // The raw waitpid status if the child has exited (reaping it), else nullopt.
  std::optional<int> TryWait();
  // Blocks until exit; returns the raw waitpid status.
  int Wait();
  // Up to `timeout` for the child to exit: its raw waitpid status, or
  // DeadlineExceeded (it goes on running).
  absl::StatusOr<int> WaitFor(absl::Duration timeout);
  // `sig` (SIGTERM unless told), up to `grace` for it to exit, then
  // SIGKILL; returns the status.
  int Terminate(absl::Duration grace, int sig = SIGTERM);
  bool running() const { return !exited_; }

 private:
  Subprocess() = default;
  static absl::StatusOr<std::unique_ptr<Subprocess>> Launch(const std::vector<std::string>& argv,
                                                            const std::vector<std::string>& env,
                                                            const std::string& log_path, const std::vector<int>& cpus,
                                                            bool pipes, bool merge_stderr);
  absl::Status NeedPipes() const;
  // Sends `sig`, then waits (waitpid with `wait_flag`) until `reached` says
  // the child's status shows it took effect.
  absl::Status SignalAndAwait(int sig, int wait_flag, bool (*reached)(int), const char* what);
  // Reads what the child's stdout has into buffer_ (closing it at EOF),
  // waiting until `deadline`; DeadlineExceeded "<waiting_for> from ...".
  absl::Status Fill(absl::Time deadline, absl::Duration timeout, const char* waiting_for);

  pid_t pid_ = -1;
  int to_child_ = -1;    // StartWithPipes: the child's stdin.
  int from_child_ = -1;  // StartWithPipes: the child's stdout.
  std::string buffer_;   // Read from the child, not yet returned.
  bool exited_ = false;
  int status_ = 0;
  std::string log_path_;
  std::string name_;
};

// "exited with code 3", "killed by signal 9 (Killed)".
std::string DescribeExit(int wait_status);

struct CommandResult {
  int status = 0;      // Raw waitpid status: WIFEXITED, WEXITSTATUS.
  std::string output;  // Its stdout.
};
// Runs argv to its end (stderr inherited) and returns its exit status and
// stdout; DeadlineExceeded (the child killed) past `timeout`.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout = absl::Minutes(10),
                                         const std::vector<std::string>& env = {});

}  // namespace duet

#endif  // DUET_BASE_SUBPROCESS_H_

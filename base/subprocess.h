// Child processes for `duet up` and the multi-process tests: start with
// argv, env and a log file, signal, and reap without blocking.
//
//   ASSIGN_OR_RETURN(auto p, Subprocess::Start({"bazel-bin/tools/duet", "router"}, {}, "/tmp/router.log"));
//   p->Signal(SIGTERM); int status = p->Wait();
//
// stdout and stderr of the child go to `log_path` (appended), or are
// inherited when it is empty. The child gets its own process group so a
// terminal's Ctrl-C reaches only the supervisor, which decides how to stop
// its children. The destructor SIGKILLs and reaps a child still running.
// Not thread-safe: one owner.
#ifndef DUET_BASE_SUBPROCESS_H_
#define DUET_BASE_SUBPROCESS_H_

#include <sys/types.h>

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
  // environment. cpus, when non-empty, pins the child to those cores.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::vector<std::string>& env,
                                                           const std::string& log_path,
                                                           const std::vector<int>& cpus = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  absl::Status Signal(int sig);
  // The raw waitpid status if the child has exited (reaping it), else nullopt.
  std::optional<int> TryWait();
  // Blocks until exit; returns the raw waitpid status.
  int Wait();
  // SIGTERM, up to `grace` for it to exit, then SIGKILL; returns the status.
  int Terminate(absl::Duration grace);
  bool running() const { return !exited_; }

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string log_path_;
  std::string name_;
};

// "exited with code 3", "killed by signal 9 (Killed)".
std::string DescribeExit(int wait_status);

}  // namespace duet

#endif  // DUET_BASE_SUBPROCESS_H_

#include "base/subprocess.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace duet {
namespace {

TEST_CASE("a child with pipes exchanges lines, and its exit status is reaped", "[subprocess]") {
  auto peer = Subprocess::StartWithPipes({"/bin/sh", "-c", "echo READY a b; read line; echo got:$line; read rest; exit 3"});
  REQUIRE(peer.ok());
  absl::StatusOr<std::string> line = (*peer)->ReadLine(absl::Seconds(30));
  REQUIRE(line.ok());
  CHECK(*line == "READY a b");
  line = (*peer)->Call("BUMP 5", absl::Seconds(30));
  REQUIRE(line.ok());
  CHECK(*line == "got:BUMP 5");
  // EOF on its stdin ends the second read: the child exits with its code.
  (*peer)->CloseStdin();
  absl::StatusOr<int> status = (*peer)->WaitFor(absl::Seconds(30));
  REQUIRE(status.ok());
  REQUIRE(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 3);
  CHECK((*peer)->ReadLine(absl::Seconds(30)).status().code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE((*peer)->running());
}

TEST_CASE("a silent child is a deadline, and a stopped one runs again when continued", "[subprocess]") {
  auto peer = Subprocess::StartWithPipes({"/bin/sh", "-c", "read line; echo $line"});
  REQUIRE(peer.ok());
  CHECK((*peer)->ReadLine(absl::Milliseconds(50)).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK((*peer)->WaitFor(absl::Milliseconds(50)).status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE((*peer)->Stop().ok());
  REQUIRE((*peer)->Continue().ok());
  absl::StatusOr<std::string> line = (*peer)->Call("after", absl::Seconds(30));
  REQUIRE(line.ok());
  CHECK(*line == "after");
}

TEST_CASE("RunCommand returns a command's output and status; $PATH finds a bare name", "[subprocess]") {
  absl::StatusOr<CommandResult> r = RunCommand({"sh", "-c", "printf 'one\\ntwo'; exit 4"}, absl::Seconds(30));
  REQUIRE(r.ok());
  CHECK(r->output == "one\ntwo");
  REQUIRE(WIFEXITED(r->status));
  CHECK(WEXITSTATUS(r->status) == 4);
  absl::StatusOr<CommandResult> env = RunCommand({"sh", "-c", "echo $DUET_SUBPROCESS_TEST"}, absl::Seconds(30),
                                                 {"DUET_SUBPROCESS_TEST=seen"});
  REQUIRE(env.ok());
  CHECK(env->output == "seen\n");
  setenv("DUET_SUBPROCESS_GONE", "here", 1);
  absl::StatusOr<CommandResult> removed =
      RunCommand({"sh", "-c", "echo ${DUET_SUBPROCESS_GONE-unset}"}, absl::Seconds(30), {"DUET_SUBPROCESS_GONE"});
  REQUIRE(removed.ok());
  CHECK(removed->output == "unset\n");
  CHECK(!RunCommand({"/no/such/program"}).ok());
  CHECK(RunCommand({"sleep", "30"}, absl::Milliseconds(100)).status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("a child started with a log file has no pipes", "[subprocess]") {
  auto p = Subprocess::Start({"/bin/true"}, {}, "");
  REQUIRE(p.ok());
  CHECK((*p)->ReadLine().status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*p)->WriteLine("x").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(WIFEXITED((*p)->Wait()));
}

TEST_CASE("a child dies with the process that started it, also when that one is SIGKILLed", "[subprocess]") {
  int ends[2];
  REQUIRE(pipe(ends) == 0);
  const pid_t starter = fork();
  REQUIRE(starter >= 0);
  if (starter == 0) {  // The starter: launches a long sleep, says its pid, then waits to be killed.
    close(ends[0]);
    auto child = Subprocess::Start({"sleep", "600"}, {}, "");
    const pid_t pid = child.ok() ? (*child)->pid() : -1;
    (void)!write(ends[1], &pid, sizeof(pid));
    pause();
    _exit(0);
  }
  close(ends[1]);
  pid_t child = -1;
  REQUIRE(read(ends[0], &child, sizeof(child)) == sizeof(child));
  close(ends[0]);
  REQUIRE(child > 0);
  // A descriptor for the child, readable once it has exited (reaped or not:
  // whoever adopts it reaps it).
  const int child_fd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  REQUIRE(child_fd >= 0);
  pollfd p{.fd = child_fd, .events = POLLIN};
  CHECK(poll(&p, 1, 0) == 0);  // Running.
  REQUIRE(kill(starter, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(starter, &status, 0) == starter);
  const bool died = poll(&p, 1, 30'000) == 1;
  if (!died) kill(child, SIGKILL);  // Not left behind by a failing run.
  close(child_fd);
  CHECK(died);
}

}  // namespace
}  // namespace duet

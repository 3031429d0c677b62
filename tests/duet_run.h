// Runs the `duet` binary (a test's data dependency, at tools/duet) as a
// user would, through /bin/sh: stdout and stderr together, and the exit code.
//
//   DuetRun r = RunDuet("sim --json ...");
//   REQUIRE(r.exit_code == 0);
//   RequireResult(RunDuet("frobnicate"), 2, {"unknown command"});
#ifndef DUET_TESTS_DUET_RUN_H_
#define DUET_TESTS_DUET_RUN_H_

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "base/subprocess.h"

namespace duet::testing {

struct DuetRun {
  int exit_code;
  std::string out;  // stdout and stderr together
};

// `env` ("NAME=value ...", may be empty) goes before the command.
inline DuetRun RunDuet(const std::string& args, const std::string& env = "") {
  absl::StatusOr<CommandResult> r =
      RunCommand({"/bin/sh", "-c", (env.empty() ? "" : env + " ") + "tools/duet " + args + " 2>&1"});
  REQUIRE(r.ok());
  return {WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1, r->output};
}

// Requires `r` to have exited with `exit_code` and printed each of `says`.
inline void RequireResult(const DuetRun& r, int exit_code, const std::vector<std::string>& says) {
  INFO(r.out);
  REQUIRE(r.exit_code == exit_code);
  for (const std::string& s : says) REQUIRE_THAT(r.out, Catch::Matchers::Contains(s));
}

}  // namespace duet::testing

#endif  // DUET_TESTS_DUET_RUN_H_

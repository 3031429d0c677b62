// The subcommands of the `duet` binary. Each takes argv from its own name on
// (argv[0] is the subcommand) and returns the process exit code.
#ifndef DUET_TOOLS_COMMANDS_H_
#define DUET_TOOLS_COMMANDS_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "base/flags.h"

namespace duet::tools {

// The common frame of duet place, profile and sim: parses argv into `flags`
// (an error: printed, exit 2), answers --help (usage on stdout, exit 0),
// then runs `run` (an error: "<command>: <status>" on stderr, exit 1; else
// exit 0).
int RunWithFlags(FlagSet& flags, int argc, char** argv, absl::FunctionRef<absl::Status(const FlagSet&)> run);

int RunGenerate(int argc, char** argv);
int RunMakeModel(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunRouter(int argc, char** argv);
int RunPrefill(int argc, char** argv);
int RunDecode(int argc, char** argv);
int RunWorker(int argc, char** argv);
int RunUp(int argc, char** argv);
int RunSim(int argc, char** argv);
int RunPlace(int argc, char** argv);
int RunProfile(int argc, char** argv);

}  // namespace duet::tools

#endif  // DUET_TOOLS_COMMANDS_H_

// The subcommands of the `duet` binary. Each takes argv from its own name on
// (argv[0] is the subcommand) and returns the process exit code.
#ifndef DUET_TOOLS_COMMANDS_H_
#define DUET_TOOLS_COMMANDS_H_

namespace duet::tools {

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
int RunPlanner(int argc, char** argv);
int RunProfile(int argc, char** argv);
int RunPrecisionPlan(int argc, char** argv);
int RunStructuredCheck(int argc, char** argv);

}  // namespace duet::tools

#endif  // DUET_TOOLS_COMMANDS_H_

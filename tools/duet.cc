// duet: prefill/decode disaggregated LLM serving. One binary, subcommands.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  const char* summary;  // Its line in the usage.
  int (*run)(int argc, char** argv);
};

// In the order the usage lists them.
constexpr Command kCommands[] = {
    {"up", "start a local cluster (router + workers) serving the OpenAI API", duet::tools::RunUp},
    {"router", "the OpenAI-compatible router", duet::tools::RunRouter},
    {"prefill", "a prefill worker", duet::tools::RunPrefill},
    {"decode", "a decode worker", duet::tools::RunDecode},
    {"worker", "a worker of any role (--role=colocated: both phases in one engine)", duet::tools::RunWorker},
    {"generate", "generate tokens from a prompt on one engine, in this process", duet::tools::RunGenerate},
    {"make-model", "write a Hugging Face model directory with random weights", duet::tools::RunMakeModel},
    {"tokenize", "text to token ids (one JSON array per stdin line), or back", duet::tools::RunTokenize},
    {"sim", "simulate a cluster serving a workload: TTFT, TPOT, SLO attainment, goodput", duet::tools::RunSim},
    {"place", "search prefill/decode placements for the best goodput per GPU under SLOs", duet::tools::RunPlace},
    {"planner", "resize the prefill and decode pools to live load (the SLA planner; Kubernetes or a dry run)",
     duet::tools::RunPlanner},
    {"profile", "time the engine on this machine and fit the latency model duet sim reads", duet::tools::RunProfile},
    {"precision-plan", "measure each layer's sensitivity to each dtype and write a precision map for a budget",
     duet::tools::RunPrecisionPlan},
    {"structured-check", "check the grammar engine on JSON schemas and their instances, token by token",
     duet::tools::RunStructuredCheck},
};

std::string Usage() {
  std::string usage = "usage: duet COMMAND [flags]\n\ncommands:\n";
  for (const Command& c : kCommands) {
    // Summaries line up in one column; a longer name keeps two spaces.
    const int pad = std::max(2, 13 - static_cast<int>(std::strlen(c.name)));
    usage += std::string("  ") + c.name + std::string(pad, ' ') + c.summary + "\n";
  }
  return usage +
         "\n"
         "`duet COMMAND --help` describes each command's flags.\n"
         "DUET_DEBUG_LOCKS=1 turns on absl::Mutex lock-order checking (the tests do).\n"
         "Without --model, commands use the embedded tiny model, made on first use\n"
         "in $XDG_CACHE_HOME/duet (else ~/.cache/duet).\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(Usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // Debian's abseil is built with lock-order (deadlock) checking on: every
  // Mutex acquisition updates a global lock graph, a few percent of the
  // router's time per streamed token. The tests keep it (DUET_DEBUG_LOCKS=1).
  const char* debug_locks = std::getenv("DUET_DEBUG_LOCKS");
  if (debug_locks == nullptr || std::strcmp(debug_locks, "1") != 0) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  const std::string cmd = argv[1];
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "duet: unknown command \"%s\"\n\n%s", cmd.c_str(), Usage().c_str());
  return 2;
}

// duet: prefill/decode disaggregated LLM serving. One binary, subcommands.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "tools/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: duet COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  up           start a local cluster (router + workers) serving the OpenAI API\n"
    "  router       the OpenAI-compatible router\n"
    "  prefill      a prefill worker\n"
    "  decode       a decode worker\n"
    "  worker       a worker of any role (--role=colocated: both phases in one engine)\n"
    "  generate     generate tokens from a prompt on one engine, in this process\n"
    "  make-model   write a Hugging Face model directory with random weights\n"
    "  tokenize     text to token ids (one JSON array per stdin line), or back\n"
    "  sim          simulate a cluster serving a workload: TTFT, TPOT, SLO attainment, goodput\n"
    "  place        search prefill/decode placements for the best goodput per GPU under SLOs\n"
    "  profile      time the engine on this machine and fit the latency model duet sim reads\n"
    "  precision-plan  measure each layer's sensitivity to each dtype and write a precision map for a budget\n"
    "\n"
    "`duet COMMAND --help` describes each command's flags.\n"
    "DUET_DEBUG_LOCKS=1 turns on absl::Mutex lock-order checking (the tests do).\n"
    "Without --model, commands use the embedded tiny model, made on first use\n"
    "in $XDG_CACHE_HOME/duet (else ~/.cache/duet).\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
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
  if (cmd == "generate") return duet::tools::RunGenerate(argc - 1, argv + 1);
  if (cmd == "make-model") return duet::tools::RunMakeModel(argc - 1, argv + 1);
  if (cmd == "tokenize") return duet::tools::RunTokenize(argc - 1, argv + 1);
  if (cmd == "up") return duet::tools::RunUp(argc - 1, argv + 1);
  if (cmd == "router") return duet::tools::RunRouter(argc - 1, argv + 1);
  if (cmd == "prefill") return duet::tools::RunPrefill(argc - 1, argv + 1);
  if (cmd == "decode") return duet::tools::RunDecode(argc - 1, argv + 1);
  if (cmd == "worker") return duet::tools::RunWorker(argc - 1, argv + 1);
  if (cmd == "sim") return duet::tools::RunSim(argc - 1, argv + 1);
  if (cmd == "place") return duet::tools::RunPlace(argc - 1, argv + 1);
  if (cmd == "profile") return duet::tools::RunProfile(argc - 1, argv + 1);
  if (cmd == "precision-plan") return duet::tools::RunPrecisionPlan(argc - 1, argv + 1);
  std::fprintf(stderr, "duet: unknown command \"%s\"\n\n%s", cmd.c_str(), kUsage);
  return 2;
}

// How fast the placement tools are, on this machine:
//
//   bazel run -c opt //tools/bench:placement
//
//   - `duet sim` of 100,000 requests (Poisson arrivals, the conversation
//     trace's lengths, overlong prompts truncated to the context) on a 16-instance cluster (8 prefill + 8 decode,
//     OPT-13B, DistServe's A100 fit): target under 2 s;
//   - `duet place` for OPT-66B on 4 nodes x 8 A100-80GB with a 10,000-request
//     workload: target under 10 s.
// Each is the wall time of the command itself (best of three), printed with
// its target and the ratio; DistServe reports up to 1.3 minutes for its
// placement search on a 96-core machine (its paper), for scale.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/subprocess.h"

namespace {

using duet::Subprocess;

// Wall seconds of the best of `runs` runs of `cmd` (its output discarded),
// or -1 when it fails.
double Time(const std::string& cmd, int runs) {
  double best = -1;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto child = Subprocess::Start({"/bin/sh", "-c", cmd}, {}, "/dev/null");
    const int rc = child.ok() ? (*child)->Wait() : -1;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rc != 0) {
      std::fprintf(stderr, "failed (%d): %s\n", rc, cmd.c_str());
      return -1;
    }
    if (best < 0 || s < best) best = s;
  }
  return best;
}

}  // namespace

int main() {
  const std::string data = "placement/testdata/";
  const std::string trace = data + "splitwise_conv.csv";
  struct Row {
    const char* what;
    std::string cmd;
    double target;
  };
  const std::vector<Row> rows = {
      {"duet sim: 100,000 requests, 16 instances",
       "tools/duet sim --model opt-13b --latency " + data + "distserve-a100-80g.json --prefill 8 --decode 8 " +
           "--rate 15 --requests 100000 --overlong truncate --lengths trace --trace " + trace +
           " --slo-ttft 0.25 --slo-tpot 0.1",
       2.0},
      {"duet place: OPT-66B, 4 x 8 GPUs, 10,000 requests",
       "tools/duet place --model opt-66b --latency " + data + "distserve-a100-80g.json --colocated-latency " + data +
           "vllm-a100-80g.json --nodes 4 --gpus-per-node 8 --requests 10000 --overlong truncate --lengths trace --trace " +
           trace,
       10.0},
  };
  std::printf("duet placement bench: wall time of each command, best of 3, on this machine\n\n");
  std::printf("%-48s %10s %10s %8s\n", "command", "seconds", "target", "ratio");
  int rc = 0;
  for (const Row& r : rows) {
    std::fprintf(stderr, "[placement bench] %s\n", r.what);
    const double s = Time(r.cmd, 3);
    if (s < 0) {
      rc = 1;
      continue;
    }
    std::printf("%-48s %10.3f %9s%.0f %8.3f %s\n", r.what, s, "< ", r.target, s / r.target,
                s < r.target ? "ok" : "MISS");
  }
  return rc;
}

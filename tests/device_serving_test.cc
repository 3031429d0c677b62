// KV crossing between device and host memory in a disaggregated cluster of
// real processes: a prefill worker on the emulated CUDA device
// (--device cuda-emulated) hands its KV to a CPU decode worker, and a CPU
// prefill to an emulated-device decode; both serve the greedy tokens (and
// logprobs) of engine::Generate on the CPU backend, as a CPU-only cluster
// does, the second round of each with its prompts' full blocks taken from
// the device pool's prefix cache.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/testing/tiny_model.h"
#include "tests/cluster.h"
#include "tests/serving_util.h"

namespace duet::testing {
namespace {

std::vector<TestRequest> GreedyRequests() {
  std::vector<TestRequest> reqs = MixedRequests(6, 1000, 70, 8, 17);
  for (TestRequest& r : reqs) {
    r.temperature = 0;
    r.logprobs = 2;
  }
  return reqs;
}

TEST_CASE("an emulated-device prefill feeds a CPU decode and a CPU prefill an emulated-device decode, with "
          "the CPU's greedy tokens",
          "[serving][device]") {
  const bool device_prefill = GENERATE(true, false);
  INFO((device_prefill ? "cuda-emulated prefill, cpu decode" : "cpu prefill, cuda-emulated decode"));
  const std::string model_dir = TinyModelDir("qwen3");
  const std::vector<std::string> device = {"--kv-blocks", "128", "--device", "cuda-emulated", "--activation-dtype",
                                           "f32"};
  const std::vector<std::string> host = {"--kv-blocks", "128"};
  Cluster c;
  REQUIRE(c.Start(model_dir, PrefillDecode(device_prefill ? device : host, device_prefill ? host : device)).ok());
  const std::vector<TestRequest> reqs = GreedyRequests();
  const auto want = ReferenceOutputs(model_dir, reqs);
  for (int round = 0; round < 2; ++round) {
    const std::vector<ParsedCompletion> got = SendAll(c.http_port(), reqs, ModelName(model_dir));
    Verdicts v;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::string diff = Verify(model_dir, got[i], want[i], reqs[i], &v);
      INFO("round " << round << ", request " << i << " (prompt " << reqs[i].prompt.size() << " tokens): " << diff);
      REQUIRE(diff.empty());
    }
  }
  auto stats = PollStats(c.http_port(), AllIdle, absl::Seconds(60));
  REQUIRE(stats.ok());
  int64_t moved = 0;
  for (auto& [id, w] : (*stats)["workers"].items()) {
    if (w["role"] == "decode") moved += w["kv_bytes_moved"].get<int64_t>();
  }
  INFO(stats->dump());
  REQUIRE(moved > 0);
}

}  // namespace
}  // namespace duet::testing

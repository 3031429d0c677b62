// A mixture of experts in the latency model: the distinct experts a batch
// touches (ModelSpec::ExpectedExperts) against a simulation of random
// routing, and the roofline's decode step growing with the batch as that
// formula says.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"

namespace duet::placement {
namespace {

// The mean number of distinct experts `tokens` tokens touch when each picks
// `k` of `e` experts uniformly without repeats, over `trials` batches.
double SimulatedExperts(int e, int k, int tokens, int trials, std::mt19937_64& rng) {
  std::vector<int> ids(static_cast<size_t>(e));
  double sum = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<bool> touched(static_cast<size_t>(e));
    for (int i = 0; i < tokens; ++i) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int j = 0; j < k; ++j) {  // A partial Fisher-Yates shuffle: k distinct experts.
        std::uniform_int_distribution<int> pick(j, e - 1);
        std::swap(ids[static_cast<size_t>(j)], ids[static_cast<size_t>(pick(rng))]);
        touched[static_cast<size_t>(ids[static_cast<size_t>(j)])] = true;
      }
    }
    sum += static_cast<double>(std::count(touched.begin(), touched.end(), true));
  }
  return sum / trials;
}

TEST_CASE("the distinct experts of a batch: E (1 - (1 - k/E)^b) against random routing", "[placement]") {
  std::mt19937_64 rng(7);
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const ModelSpec m = ModelPreset(name).value();
    for (int b : {1, 2, 8, 32, 128}) {
      const double sim = SimulatedExperts(static_cast<int>(m.num_experts), static_cast<int>(m.experts_per_token), b,
                                          1000, rng);
      INFO(name << " b=" << b << ": formula " << m.ExpectedExperts(b) << ", simulated " << sim);
      CHECK(std::abs(m.ExpectedExperts(b) - sim) <= 0.01 * sim);
    }
    CHECK(m.ExpectedExperts(1) == Approx(m.experts_per_token));
    CHECK(m.ExpectedExperts(100000) == Approx(m.num_experts));
  }
}

TEST_CASE("a mixture of experts' roofline decode step grows with the batch as its distinct experts do",
          "[placement]") {
  const GpuSpec g = LoadGpu("h100-sxm").value();
  const RooflineCoefficients co;
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const ModelSpec m = ModelPreset(name).value();
    auto lm = NewRooflineLatency(m, g, co);
    const double per_expert = 3.0 * m.hidden * m.expert_intermediate * m.dtype_bytes * m.moe_layers;
    const double t1 = lm->Decode({}, std::vector<int64_t>(1, 0));
    for (int b : {2, 8, 32, 128}) {
      // Memory-bound at these batches: the step's extra time is the extra
      // experts' bytes (and the rows' KV) at the roofline's bandwidth.
      const double e = static_cast<double>(m.num_experts);
      const double experts = e * (1 - std::pow(1 - m.experts_per_token / e, b)) - m.experts_per_token;
      const double kv = (b - 1.0) * m.KvBytesPerToken();
      const double want = (experts * per_expert + kv) / (g.memory_bw * co.memory_efficiency);
      const double got = lm->Decode({}, std::vector<int64_t>(static_cast<size_t>(b), 0)) - t1;
      INFO(name << " b=" << b);
      CHECK(got == Approx(want).epsilon(1e-6));
    }
    // All experts read once a batch touches them all: the step is then no
    // dearer per expert than a dense model of every expert's weights.
    CHECK(m.WeightBytesRead(100000) == Approx(static_cast<double>(m.WeightBytes())));
    CHECK(m.WeightBytesRead(1) < 0.5 * m.WeightBytes());
  }
  // A dense model's step reads all of its weights at any batch.
  const ModelSpec dense = ModelPreset("qwen3-8b").value();
  CHECK(dense.WeightBytesRead(1) == Approx(static_cast<double>(dense.WeightBytes())));
}

}  // namespace
}  // namespace duet::placement

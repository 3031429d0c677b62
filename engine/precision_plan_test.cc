// The planner's program against brute force: on random sensitivities and
// sizes (layers of equal shapes, as in a Llama model, and of unequal ones),
// the plan fits the budget and no choice of dtypes that fits has less total
// sensitivity. The measuring half runs on real models in
// tests/precision_plan_test.cc.
#include "engine/precision_plan.h"

#include <catch2/catch.hpp>
#include <random>

namespace duet::engine {
namespace {

struct Best {
  double sensitivity = -1;
  int64_t bytes = 0;
};

Best BruteForce(const Sensitivity& s, int64_t budget) {
  const size_t layers = s.kl.size(), nd = s.dtypes.size();
  std::vector<size_t> c(layers, 0);
  Best best;
  while (true) {
    double kl = 0;
    int64_t bytes = 0;
    for (size_t i = 0; i < layers; ++i) {
      kl += s.kl[i][c[i]];
      bytes += s.bytes[i][c[i]];
    }
    if (bytes <= budget && (best.sensitivity < 0 || kl < best.sensitivity)) best = {kl, bytes};
    size_t i = 0;
    while (i < layers && ++c[i] == nd) c[i++] = 0;
    if (i == layers) return best;
  }
}

TEST_CASE("PlanPrecision finds the least total sensitivity within the budget, as brute force does", "[precision]") {
  std::mt19937_64 rng(11);
  const bool equal_shapes = GENERATE(true, false);
  int exact_budget_hits = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Sensitivity s;
    s.dtypes = {kernels::DType::kBF16, kernels::DType::kQ8, kernels::DType::kQ4};
    const size_t layers = 2 + rng() % 6;
    // Bytes per 32 weights of each dtype, times the layer's blocks.
    const int64_t per_block[] = {64, 34, 18};
    const int64_t shared_blocks = 100 + static_cast<int64_t>(rng() % 5000);
    int64_t least = 0, most = 0;
    for (size_t i = 0; i < layers; ++i) {
      const int64_t blocks = equal_shapes ? shared_blocks : 100 + static_cast<int64_t>(rng() % 5000);
      std::vector<double> kl(3);
      // Lower precision costs more: q4 >= q8 >= bf16 in each layer.
      kl[0] = std::uniform_real_distribution<double>(0, 0.01)(rng);
      kl[1] = kl[0] + std::uniform_real_distribution<double>(0, 0.1)(rng);
      kl[2] = kl[1] + std::uniform_real_distribution<double>(0, 1.0)(rng);
      s.kl.push_back(kl);
      s.bytes.push_back({blocks * per_block[0], blocks * per_block[1], blocks * per_block[2]});
      least += s.bytes.back()[2];
      most += s.bytes.back()[0];
    }
    const int64_t budget = least + static_cast<int64_t>(rng() % static_cast<uint64_t>(most - least + 1));
    INFO("trial " << trial << ", " << layers << " layers, budget " << budget);
    absl::StatusOr<PrecisionPlan> plan = PlanPrecision(s, budget);
    REQUIRE(plan.ok());
    const Best want = BruteForce(s, budget);
    CHECK(plan->layer_bytes <= budget);
    CHECK(plan->sensitivity == Approx(want.sensitivity).epsilon(1e-12));
    CHECK(!plan->rounded);
    double kl = 0;
    int64_t bytes = 0;
    for (size_t i = 0; i < layers; ++i) {
      kl += s.kl[i][plan->choice[i]];
      bytes += s.bytes[i][plan->choice[i]];
    }
    CHECK(kl == Approx(plan->sensitivity));
    CHECK(bytes == plan->layer_bytes);
    exact_budget_hits += want.bytes == plan->layer_bytes;
  }
  CHECK(exact_budget_hits > 0);

  SECTION("a budget below every choice is a clear error") {
    Sensitivity s;
    s.dtypes = {kernels::DType::kQ8, kernels::DType::kQ4};
    s.kl = {{0.1, 0.5}, {0.1, 0.5}};
    s.bytes = {{34, 18}, {34, 18}};
    absl::StatusOr<PrecisionPlan> plan = PlanPrecision(s, 35);
    REQUIRE(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(plan.status().message()), Catch::Contains("at least 36 bytes"));
    plan = PlanPrecision(s, 52);
    REQUIRE(plan.ok());
    CHECK(plan->sensitivity == Approx(0.6));
    CHECK(plan->unit_bytes == 2);
  }
}

TEST_CASE("CompareLogits: KL zero for equal logits, shift-invariant, a hand computation; top-1 agreement", "[precision]") {
  const std::vector<float> a = {1, 2, 3, 0, 0, 0};
  const std::vector<float> shifted = {11, 12, 13, -5, -5, -5};
  CHECK(CompareLogits(a, a, 3).mean_kl == 0);
  CHECK(CompareLogits(a, shifted, 3).mean_kl == Approx(0).margin(1e-12));
  CHECK(CompareLogits(a, shifted, 3).top1_agreement == 1);
  // Row 1 uniform against {1,2,3}: KL(u || q) = -log 3 - mean(log q).
  const std::vector<float> u = {0, 0, 0, 0, 0, 0};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double row0 = -std::log(3.0) - ((1 - lse) + (2 - lse) + (3 - lse)) / 3;
  CHECK(CompareLogits(u, a, 3).mean_kl == Approx(row0 / 2));
  const std::vector<float> b = {3, 2, 1, 0, 0, 1};  // Both rows' top tokens move.
  CHECK(CompareLogits(a, b, 3).top1_agreement == 0.0);
  CHECK(CompareLogits(shifted, std::vector<float>{0, 0, 9, 0, 0, 0}, 3).top1_agreement == 1.0);
}

}  // namespace
}  // namespace duet::engine

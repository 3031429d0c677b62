#include "placement/profile_fit.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace duet::placement {
namespace {


std::vector<ProfilePoint> Prefill(double a, double b, double c) {
  std::vector<ProfilePoint> pts;
  for (double l : {16.0, 64.0, 256.0, 1024.0}) {
    for (double n : {1.0, 2.0}) {
      const double s1 = n * l, s2 = n * l * l;
      pts.push_back({{1, s1, s2}, a + b * s1 + c * s2});
    }
  }
  return pts;
}

// ms = 5 + 0.01 sum(ctx) + 2 batch below 4 sequences, 20 + 0.02 sum(ctx) + 1 batch from 4 on.
std::vector<ProfilePoint> TwoRegimeDecode(const std::vector<int64_t>& batches) {
  std::vector<ProfilePoint> pts;
  for (int64_t n : batches) {
    for (double ctx : {100.0, 200.0, 400.0}) {
      const double sum = n * ctx;
      const double ms = n < 4 ? 5 + 0.01 * sum + 2 * n : 20 + 0.02 * sum + 1 * n;
      pts.push_back({{1, sum, static_cast<double>(n)}, ms});
    }
  }
  return pts;
}

TEST_CASE("exact timings give back their coefficients, and the regimes' split", "[placement][profile]") {
  const std::vector<int64_t> batches = {1, 2, 3, 4, 6, 8};
  auto fit = FitProfile(Prefill(3, 0.05, 2e-5), TwoRegimeDecode(batches), batches);
  REQUIRE(fit.ok());
  CHECK(fit->prefill[0] == Approx(3).epsilon(1e-6));
  CHECK(fit->prefill[1] == Approx(0.05).epsilon(1e-6));
  CHECK(fit->prefill[2] == Approx(2e-5).epsilon(1e-6));
  CHECK(fit->threshold == 4);
  CHECK(fit->decode_small[0] == Approx(5).epsilon(1e-6));
  CHECK(fit->decode_small[1] == Approx(0.01).epsilon(1e-6));
  CHECK(fit->decode_small[2] == Approx(2).epsilon(1e-6));
  CHECK(fit->decode_large[0] == Approx(20).epsilon(1e-6));
  CHECK(fit->decode_large[1] == Approx(0.02).epsilon(1e-6));
  CHECK(fit->decode_large[2] == Approx(1).epsilon(1e-6));
  // The table: one row per batch size, the batch term folded into its intercept.
  REQUIRE(fit->by_batch.size() == batches.size());
  CHECK(fit->by_batch[0][0] == 1);
  CHECK(fit->by_batch[0][1] == Approx(7).epsilon(1e-6));
  CHECK(fit->by_batch[0][2] == Approx(0.01).epsilon(1e-6));
  CHECK(fit->by_batch[5][0] == 8);
  CHECK(fit->by_batch[5][1] == Approx(28).epsilon(1e-6));
  CHECK(fit->by_batch[5][2] == Approx(0.02).epsilon(1e-6));

  nlohmann::ordered_json entry = ProfileEntry(*fit);
  CHECK(entry["decoding_large_small_bs_threshold"] == 4);
  CHECK(entry["decoding_by_batch"].size() == batches.size());
  CHECK(entry["prefill"].size() == 3);
}

TEST_CASE("without three shapes on each side of a split, decode keeps one regime", "[placement][profile]") {
  std::vector<ProfilePoint> decode;
  for (int64_t n : {1, 2, 4}) {
    for (double ctx : {100.0, 300.0}) decode.push_back({{1, n * ctx, static_cast<double>(n)}, 4 + 0.01 * n * ctx + 3 * n});
  }
  auto fit = FitProfile(Prefill(1, 0.1, 0), decode, {1, 2, 4});
  REQUIRE(fit.ok());
  CHECK(fit->threshold == kOneDecodeRegime);
  CHECK(fit->decode_small == fit->decode_large);
  CHECK(fit->decode_small[2] == Approx(3).epsilon(1e-6));
  const ProfilePoint p{{1, 800, 8}, 0};
  CHECK(Predict(p, fit->decode_small) == Approx(4 + 8 + 24).epsilon(1e-6));
  CHECK(fit->by_batch.size() == 3);
}

TEST_CASE("too few or degenerate shapes are refused", "[placement][profile]") {
  const std::vector<int64_t> batches = {1, 2, 3, 4, 6, 8};
  auto few = FitProfile({{{1, 16, 256}, 2}}, TwoRegimeDecode(batches), batches);
  CHECK(few.status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<ProfilePoint> same(4, ProfilePoint{{1, 16, 256}, 2});
  auto singular = FitProfile(same, TwoRegimeDecode(batches), batches);
  CHECK(singular.status().code() == absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace duet::placement

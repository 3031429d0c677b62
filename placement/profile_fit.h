// Fitting measured engine times to the latency formats duet sim reads: what
// `duet profile` does with the batch shapes it timed.
//
//   ASSIGN_OR_RETURN(ProfileFit fit, FitProfile(prefill_points, decode_points, batch_sizes));
//   nlohmann::ordered_json entry = ProfileEntry(fit);   // DistServe's format, TP 1
//
// Prefill is DistServe's `a + b sum(l) + c sum(l^2)` ms; decode is
// `a + b sum(context) + c batch` ms in two batch-size regimes split at the
// threshold that fits best (none: one regime), plus duet's own table, one
// `a + b sum(context)` per batch size, which follows the bends two linear
// regimes cannot. Every fit minimises relative error. Pure: thread-safe.
#ifndef DUET_PLACEMENT_PROFILE_FIT_H_
#define DUET_PLACEMENT_PROFILE_FIT_H_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::placement {

// One timed shape: prefill x = {1, sum(l), sum(l^2)}, decode x = {1,
// sum(context), batch}; `ms` its median time.
struct ProfilePoint {
  std::array<double, 3> x;
  double ms = 0;
};

inline constexpr int64_t kOneDecodeRegime = int64_t{1} << 30;

struct ProfileFit {
  std::vector<double> prefill;  // a, b, c
  // Batches below it use decode_small, the rest decode_large;
  // kOneDecodeRegime: decode_small serves every batch.
  int64_t threshold = kOneDecodeRegime;
  std::vector<double> decode_small, decode_large;  // a, b, c
  std::vector<std::array<double, 3>> by_batch;     // [batch, a, b], by batch
};

// InvalidArgument with fewer than three shapes of either phase; Internal when
// the shapes do not determine the coefficients (a singular fit).
// `batch_sizes` are the decode batch sizes timed, ascending: the candidate
// thresholds and the table's rows.
absl::StatusOr<ProfileFit> FitProfile(const std::vector<ProfilePoint>& prefill,
                                      const std::vector<ProfilePoint>& decode,
                                      const std::vector<int64_t>& batch_sizes);

// a + b x[1] + c x[2]: what the coefficients predict for a shape.
double Predict(const ProfilePoint& p, const std::vector<double>& c);

// The decode points of batches below `threshold`, and the rest.
std::pair<std::vector<ProfilePoint>, std::vector<ProfilePoint>> SplitDecode(const std::vector<ProfilePoint>& decode,
                                                                            int64_t threshold);

// The fit as one TP entry of DistServe's profile format, with duet's
// "decoding_by_batch" beside it when there is a table.
nlohmann::ordered_json ProfileEntry(const ProfileFit& fit);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_PROFILE_FIT_H_

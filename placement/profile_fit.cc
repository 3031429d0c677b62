#include "placement/profile_fit.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace duet::placement {
namespace {

// Least squares for y = X b with three columns (normal equations), on the
// columns `use` says (the others' coefficients are 0), rows weighted by `w`.
std::vector<double> Fit3(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                         const std::vector<double>& w, std::array<bool, 3> use) {
  double a[3][4] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) a[r][c] += w[i] * x[i][r] * x[i][c];
      a[r][3] += w[i] * x[i][r] * y[i];
    }
  }
  for (int r = 0; r < 3; ++r) {
    if (use[r]) continue;
    for (int c = 0; c < 4; ++c) a[r][c] = 0;
    for (int c = 0; c < 3; ++c) a[c][r] = 0;
    a[r][r] = 1;
  }
  for (int p = 0; p < 3; ++p) {  // Gauss-Jordan with partial pivoting
    int best = p;
    for (int r = p + 1; r < 3; ++r) {
      if (std::fabs(a[r][p]) > std::fabs(a[best][p])) best = r;
    }
    for (int c = 0; c < 4; ++c) std::swap(a[p][c], a[best][c]);
    if (std::fabs(a[p][p]) < 1e-300) return {0, 0, 0};
    for (int r = 0; r < 3; ++r) {
      if (r == p) continue;
      const double f = a[r][p] / a[p][p];
      for (int c = 0; c < 4; ++c) a[r][c] -= f * a[p][c];
    }
  }
  return {a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]};
}

// Weighted by 1/ms^2: least squares on relative error.
std::vector<double> Fit(const std::vector<ProfilePoint>& pts, std::array<bool, 3> use) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y, w;
  for (const ProfilePoint& p : pts) {
    x.push_back(p.x);
    y.push_back(p.ms);
    w.push_back(1 / (p.ms * p.ms));
  }
  return Fit3(x, y, w, use);
}

double SquaredError(const std::vector<ProfilePoint>& pts, const std::vector<double>& c) {
  double e = 0;
  for (const ProfilePoint& p : pts) e += std::pow((Predict(p, c) - p.ms) / p.ms, 2);
  return e;
}

size_t BatchSizes(const std::vector<ProfilePoint>& pts) {
  std::set<double> b;
  for (const ProfilePoint& p : pts) b.insert(p.x[2]);
  return b.size();
}

}  // namespace

double Predict(const ProfilePoint& p, const std::vector<double>& c) { return c[0] + c[1] * p.x[1] + c[2] * p.x[2]; }

std::pair<std::vector<ProfilePoint>, std::vector<ProfilePoint>> SplitDecode(const std::vector<ProfilePoint>& decode,
                                                                            int64_t threshold) {
  std::pair<std::vector<ProfilePoint>, std::vector<ProfilePoint>> parts;
  for (const ProfilePoint& p : decode) {
    (p.x[2] < static_cast<double>(threshold) ? parts.first : parts.second).push_back(p);
  }
  return parts;
}

absl::StatusOr<ProfileFit> FitProfile(const std::vector<ProfilePoint>& prefill,
                                      const std::vector<ProfilePoint>& decode,
                                      const std::vector<int64_t>& batch_sizes) {
  if (prefill.size() < 3 || decode.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat("too few shapes to fit three coefficients (", prefill.size(),
                                                   " prefill, ", decode.size(),
                                                   " decode): raise --max-context or --max-batch"));
  }
  const std::vector<double> zero = {0, 0, 0};
  ProfileFit fit;
  fit.prefill = Fit(prefill, {true, true, true});
  // Decode in two regimes, as DistServe's format allows: batches below the
  // threshold use decoding_smallbs, the rest decoding_largebs. On the CPU
  // backend one sequence is a matrix-vector product and several a packed
  // GEMM, so the cost per sequence changes with the batch. The threshold with
  // the smallest error wins (none: one set for all). A side with one batch
  // size fits no per-sequence term (it would be the intercept's twin).
  fit.decode_small = Fit(decode, {true, true, true});
  fit.decode_large = fit.decode_small;
  double best = fit.decode_small == zero ? std::numeric_limits<double>::infinity()
                                         : SquaredError(decode, fit.decode_small);
  for (int64_t t : batch_sizes) {
    if (t < 2) continue;
    const auto [small, large] = SplitDecode(decode, t);
    if (small.size() < 3 || large.size() < 3) continue;
    const std::vector<double> s = Fit(small, {true, true, BatchSizes(small) > 1});
    const std::vector<double> l = Fit(large, {true, true, BatchSizes(large) > 1});
    if (s == zero || l == zero) continue;
    const double e = SquaredError(small, s) + SquaredError(large, l);
    if (e < best) {
      best = e;
      fit.threshold = t;
      fit.decode_small = s;
      fit.decode_large = l;
    }
  }
  // duet's own decode table: per batch size, a + b sum(context) over its
  // contexts (the GEMV of one sequence, the dot kernel of a few, the packed
  // GEMM of many each get their own line).
  for (int64_t n : batch_sizes) {
    std::vector<ProfilePoint> pts;
    for (const ProfilePoint& p : decode) {
      if (p.x[2] == static_cast<double>(n)) pts.push_back(p);
    }
    if (pts.empty()) continue;
    const std::vector<double> c = Fit(pts, {true, pts.size() > 1, false});
    if (c == zero) continue;
    fit.by_batch.push_back({static_cast<double>(n), c[0], c[1]});
  }
  if (fit.prefill == zero || !std::isfinite(best)) {
    return absl::InternalError("the shapes do not determine the coefficients (singular fit)");
  }
  return fit;
}

nlohmann::ordered_json ProfileEntry(const ProfileFit& fit) {
  nlohmann::ordered_json entry;
  entry["decoding_large_small_bs_threshold"] = fit.threshold;  // batches below it: decoding_smallbs
  entry["prefill"] = fit.prefill;
  entry["decoding_smallbs"] = fit.decode_small;
  entry["decoding_largebs"] = fit.decode_large;
  // duet's extension: [[batch, a, b], ...]; duet sim prefers it.
  if (!fit.by_batch.empty()) entry["decoding_by_batch"] = fit.by_batch;
  return entry;
}

}  // namespace duet::placement

#include "tools/bench/timed_backend.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "tools/bench/timing.h"

namespace duet::bench {

double TimedBackend::TotalSeconds() const {
  double total = 0;
  for (const auto& [key, s] : stats_) total += s.seconds;
  return total;
}

absl::Status TimedBackend::Gemm(const float* a, const kernels::WeightMatrix& w, const float* bias, float* c,
                                int64_t m, bool accumulate) {
  if (enabled_) {
    gemm_ = &stats_[absl::StrCat(m == 1 ? "gemv" : "gemm", " ", kernels::DTypeName(w.dtype), " n=", w.n, " k=", w.k)];
    gemm_->flops += 2.0 * m * w.n * w.k;
    gemm_->weight_bytes += static_cast<double>(w.n) * w.k * kernels::BitsPerWeight(w.dtype) / 8;
  }
  absl::Status st = ForwardingBackend::Gemm(a, w, bias, c, m, accumulate);
  gemm_ = nullptr;
  return st;
}

void TimedBackend::Call(const char* op, absl::FunctionRef<void()> run) {
  if (!enabled_) {
    run();
    return;
  }
  OpStat& stat = gemm_ != nullptr ? *gemm_ : stats_[op];
  const auto start = Clock::now();
  run();
  stat.seconds += SecondsSince(start);
  stat.calls += 1;
}

}  // namespace duet::bench

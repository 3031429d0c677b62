#include "tools/bench/timed_backend.h"

#include <chrono>
#include <set>
#include <vector>

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

absl::Status TimedBackend::Moe(const kernels::MoeArgs& a) {
  std::set<int32_t> touched;
  std::vector<int32_t> experts(static_cast<size_t>(a.top_k));
  std::vector<float> weights(static_cast<size_t>(a.top_k));
  for (int64_t r = 0; r < a.rows; ++r) {
    kernels::RouteRow(a.scores + r * a.num_experts, a.num_experts, a.top_k, a.renormalize, experts.data(),
                      weights.data());
    touched.insert(experts.begin(), experts.end());
  }
  for (int32_t e : touched) {
    for (const kernels::WeightMatrix* w : {&a.experts[e].gate_up, &a.experts[e].down}) {
      expert_bytes_ += static_cast<double>(w->n) * w->k * kernels::BitsPerWeight(w->dtype) / 8;
    }
  }
  return ForwardingBackend::Moe(a);
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

#include "tools/bench/timed_backend.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "tools/bench/timing.h"

namespace duet::bench {
namespace {

// Times fn() into stat when enabled.
template <typename Fn>
void Timed(bool enabled, TimedBackend::OpStat* stat, Fn&& fn) {
  if (!enabled) {
    fn();
    return;
  }
  const auto start = Clock::now();
  fn();
  stat->seconds += SecondsSince(start);
  stat->calls += 1;
}

}  // namespace

double TimedBackend::TotalSeconds() const {
  double total = 0;
  for (const auto& [key, s] : stats_) total += s.seconds;
  return total;
}

void TimedBackend::Gemm(const float* a, const float* w, const float* bias, float* c, int64_t m,
                        int64_t n, int64_t k, bool accumulate) {
  OpStat* s = nullptr;
  if (enabled_) {
    s = &Stat(absl::StrCat(m == 1 ? "gemv" : "gemm", " n=", n, " k=", k));
    s->flops += 2.0 * m * n * k;
    s->weight_bytes += 4.0 * n * k;
  }
  Timed(enabled_, s, [&] { inner_->Gemm(a, w, bias, c, m, n, k, accumulate); });
}

absl::Status TimedBackend::Gemm(const float* a, const kernels::WeightMatrix& w, const float* bias, float* c,
                                int64_t m, bool accumulate) {
  OpStat* s = nullptr;
  if (enabled_) {
    s = &Stat(absl::StrCat(m == 1 ? "gemv" : "gemm", " ", kernels::DTypeName(w.dtype), " n=", w.n, " k=", w.k));
    s->flops += 2.0 * m * w.n * w.k;
    s->weight_bytes += static_cast<double>(w.n) * w.k * kernels::BitsPerWeight(w.dtype) / 8;
  }
  absl::Status st;
  Timed(enabled_, s, [&] { st = inner_->Gemm(a, w, bias, c, m, accumulate); });
  return st;
}

absl::Status TimedBackend::EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, float* out,
                                           int64_t num_tokens) {
  absl::Status st;
  Timed(enabled_, enabled_ ? &Stat("embedding") : nullptr,
        [&] { st = inner_->EmbeddingLookup(table, ids, out, num_tokens); });
  return st;
}

void TimedBackend::RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                           float eps) {
  Timed(enabled_, enabled_ ? &Stat("rmsnorm") : nullptr,
        [&] { inner_->RmsNorm(x, w, y, rows, dim, eps); });
}

void TimedBackend::Rope(float* x, const int32_t* positions, const float* inv_freq,
                        int64_t num_tokens, int64_t num_heads, int64_t head_dim) {
  Timed(enabled_, enabled_ ? &Stat("rope") : nullptr,
        [&] { inner_->Rope(x, positions, inv_freq, num_tokens, num_heads, head_dim); });
}

void TimedBackend::SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) {
  Timed(enabled_, enabled_ ? &Stat("silu_mul") : nullptr,
        [&] { inner_->SiluMul(gu, out, rows, inter); });
}

void TimedBackend::Softmax(float* x, int64_t rows, int64_t n) {
  Timed(enabled_, enabled_ ? &Stat("softmax") : nullptr, [&] { inner_->Softmax(x, rows, n); });
}

void TimedBackend::EmbeddingLookup(const float* table, const int32_t* ids, float* out,
                                   int64_t num_tokens, int64_t dim) {
  Timed(enabled_, enabled_ ? &Stat("embedding") : nullptr,
        [&] { inner_->EmbeddingLookup(table, ids, out, num_tokens, dim); });
}

void TimedBackend::PagedAttention(const kernels::PagedAttentionArgs& args) {
  Timed(enabled_, enabled_ ? &Stat("attention") : nullptr, [&] { inner_->PagedAttention(args); });
}

std::vector<std::pair<int32_t, float>> TimedBackend::TopK(const float* x, int64_t n, int64_t k) {
  std::vector<std::pair<int32_t, float>> out;
  Timed(enabled_, enabled_ ? &Stat("topk") : nullptr, [&] { out = inner_->TopK(x, n, k); });
  return out;
}

}  // namespace duet::bench

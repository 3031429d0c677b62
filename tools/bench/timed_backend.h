// A KernelBackend that forwards every op to another backend and adds up the
// wall time spent in each op class: where a forward pass's time goes.
//
//   TimedBackend timed(kernels::NewCpuBackend(2));
//   model = Model::Load(dir, &timed);  ... timed.Reset(); Forward ...; timed.Report();
//
// Backend calls are synchronous (the CPU backend's ParallelFor returns when
// every slice is done), so the wall time of a call is the op's time. GEMMs are
// keyed by their n x k (the weight) and whether m is 1 (GEMV path), with the
// FLOPs and weight bytes they did, so a row reads as GFLOP/s or weight GB/s.
// Benchmark-only; not thread-safe (the engine calls one op at a time).
#ifndef DUET_TOOLS_BENCH_TIMED_BACKEND_H_
#define DUET_TOOLS_BENCH_TIMED_BACKEND_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace duet::bench {

class TimedBackend final : public kernels::KernelBackend {
 public:
  struct OpStat {
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;         // GEMMs only.
    double weight_bytes = 0;  // GEMMs only: the weight matrix's bytes per call.
  };

  explicit TimedBackend(kernels::KernelBackendPtr inner) : inner_(std::move(inner)) {}

  // Enable/disable accounting (the wrapper's own cost is two clock reads).
  void set_enabled(bool on) { enabled_ = on; }
  void Reset() { stats_.clear(); }
  const std::map<std::string, OpStat>& stats() const { return stats_; }
  double TotalSeconds() const;

  std::string Name() const override { return "timed(" + inner_->Name() + ")"; }
  kernels::BufferType& DefaultBufferType() override { return inner_->DefaultBufferType(); }
  void Gemm(const float* a, const float* w, const float* bias, float* c, int64_t m, int64_t n,
            int64_t k, bool accumulate) override;
  bool Supports(kernels::WeightOp op, kernels::DType dtype) const override { return inner_->Supports(op, dtype); }
  absl::Status Gemm(const float* a, const kernels::WeightMatrix& w, const float* bias, float* c, int64_t m,
                    bool accumulate) override;
  absl::Status EmbeddingLookup(const kernels::WeightMatrix& table, const int32_t* ids, float* out,
                               int64_t num_tokens) override;
  void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
               float eps) override;
  void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
            int64_t num_heads, int64_t head_dim) override;
  void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) override;
  void Softmax(float* x, int64_t rows, int64_t n) override;
  void EmbeddingLookup(const float* table, const int32_t* ids, float* out, int64_t num_tokens,
                       int64_t dim) override;
  kernels::DType DefaultKvDType() const override { return inner_->DefaultKvDType(); }
  bool SupportsKv(kernels::DType dtype) const override { return inner_->SupportsKv(dtype); }
  void PagedAttention(const kernels::PagedAttentionArgs& args) override;
  void KvStore(const kernels::KvStoreArgs& args) override { inner_->KvStore(args); }
  void Add(const float* x, float* y, int64_t n) override { inner_->Add(x, y, n); }
  void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) override {
    inner_->GatherRows(x, rows, num_rows, dim, out);
  }
  std::vector<std::pair<int32_t, float>> TopK(const float* x, int64_t n, int64_t k) override;

 private:
  OpStat& Stat(const std::string& key) { return stats_[key]; }

  kernels::KernelBackendPtr inner_;
  bool enabled_ = true;
  std::map<std::string, OpStat> stats_;
};

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_TIMED_BACKEND_H_

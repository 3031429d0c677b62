// A KernelBackend that forwards every op to another backend and adds up the
// wall time spent in each op (kernels/forwarding_backend.h's names; GEMMs
// by shape): where a forward pass's time goes.
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

#include "kernels/forwarding_backend.h"

namespace duet::bench {

class TimedBackend final : public kernels::ForwardingBackend {
 public:
  struct OpStat {
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;         // GEMMs only.
    double weight_bytes = 0;  // GEMMs only: the weight matrix's bytes per call.
  };

  explicit TimedBackend(kernels::KernelBackendPtr inner) : ForwardingBackend(std::move(inner)) {}

  // Enable/disable accounting (the wrapper's own cost is two clock reads).
  void set_enabled(bool on) { enabled_ = on; }
  void Reset() { stats_.clear(); }
  const std::map<std::string, OpStat>& stats() const { return stats_; }
  double TotalSeconds() const;

  std::string Name() const override { return "timed(" + ForwardingBackend::Name() + ")"; }
  absl::Status Gemm(const float* a, const kernels::WeightMatrix& w, const float* bias, float* c, int64_t m,
                    bool accumulate) override;
  // Also counts, timed or not, the weight bytes of the distinct experts
  // each call's rows chose (read from its scores: host memory, so CPU
  // backends only).
  absl::Status Moe(const kernels::MoeArgs& args) override;
  // The experts' weight bytes Moe calls have read since the start.
  double expert_bytes() const { return expert_bytes_; }

 protected:
  void Call(const char* op, absl::FunctionRef<void()> run) override;

 private:
  bool enabled_ = true;
  OpStat* gemm_ = nullptr;  // The stat of the GEMM being run (keyed by its shape), else null.
  std::map<std::string, OpStat> stats_;
  double expert_bytes_ = 0;
};

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_TIMED_BACKEND_H_

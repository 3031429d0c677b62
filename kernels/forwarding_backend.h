// A KernelBackend that runs every op on another backend, each call passed
// through one hook: the base of the backends that wrap one (the bench's
// timing backend, the tests' protected one), so that an op added to
// kernels/backend.h is forwarded, named and hooked in this one place.
//
//   class Counting : public ForwardingBackend {
//     using ForwardingBackend::ForwardingBackend;
//     void Call(const char* op, absl::FunctionRef<void()> run) override { ++calls_[op]; run(); }
//   };
#ifndef DUET_KERNELS_FORWARDING_BACKEND_H_
#define DUET_KERNELS_FORWARDING_BACKEND_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "kernels/backend.h"

namespace duet::kernels {

class ForwardingBackend : public KernelBackend {
 public:
  explicit ForwardingBackend(KernelBackendPtr inner) : inner_(std::move(inner)) {}

  KernelBackend& inner() { return *inner_; }
  std::string Name() const override { return inner_->Name(); }
  bool Implements(std::string_view op) const override { return inner_->Implements(op); }
  BufferType& DefaultBufferType() override { return inner_->DefaultBufferType(); }
  bool Supports(WeightOp op, DType dtype) const override { return inner_->Supports(op, dtype); }
  absl::Status MakeResident(const void* host, int64_t bytes) override { return inner_->MakeResident(host, bytes); }
  void ReleaseResident(const void* host) override { inner_->ReleaseResident(host); }
  absl::Status BeginCapture() override { return inner_->BeginCapture(); }
  absl::StatusOr<std::unique_ptr<StepGraph>> EndCapture() override { return inner_->EndCapture(); }
  absl::Status Replay(StepGraph& graph) override { return inner_->Replay(graph); }
  DType DefaultKvDType() const override { return inner_->DefaultKvDType(); }
  bool SupportsKv(DType dtype) const override { return inner_->SupportsKv(dtype); }

  absl::Status Gemm(const float* a, const WeightMatrix& w, const float* bias, float* c, int64_t m,
                    bool accumulate) override;
  absl::Status EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, float* out,
                               int64_t num_tokens) override;
  void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override;
  void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens, int64_t num_heads,
            int64_t head_dim) override;
  void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) override;
  void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) override;
  void Scale(float* x, float s, int64_t n) override;
  void PagedAttention(const PagedAttentionArgs& args) override;
  void KvStore(const KvStoreArgs& args) override;
  void Add(const float* x, float* y, int64_t n) override;
  void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) override;
  void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
              int64_t cols) override;
  absl::Status Moe(const MoeArgs& args) override;
  void AllReduceSum(Communicator& comm, float* data, int64_t n) override;
  void Send(Communicator& comm, int peer, const float* data, int64_t n) override;
  void Recv(Communicator& comm, int peer, float* data, int64_t n) override;

 protected:
  // Runs one op (`run` calls the inner backend) named `op`, one of kOpNames.
  virtual void Call(const char* op, absl::FunctionRef<void()> run) { run(); }

 private:
  KernelBackendPtr inner_;
};

}  // namespace duet::kernels

#endif  // DUET_KERNELS_FORWARDING_BACKEND_H_

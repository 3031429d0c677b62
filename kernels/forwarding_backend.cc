#include "kernels/forwarding_backend.h"

namespace duet::kernels {

absl::Status ForwardingBackend::Gemm(const float* a, const WeightMatrix& w, const float* bias, float* c, int64_t m,
                                     bool accumulate) {
  absl::Status st;
  Call("gemm", [&] { st = inner_->Gemm(a, w, bias, c, m, accumulate); });
  return st;
}

absl::Status ForwardingBackend::EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, float* out,
                                                int64_t num_tokens) {
  absl::Status st;
  Call("embedding", [&] { st = inner_->EmbeddingLookup(table, ids, out, num_tokens); });
  return st;
}

void ForwardingBackend::RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  Call("rms_norm", [&] { inner_->RmsNorm(x, w, y, rows, dim, eps); });
}

void ForwardingBackend::Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                             int64_t num_heads, int64_t head_dim) {
  Call("rope", [&] { inner_->Rope(x, positions, inv_freq, num_tokens, num_heads, head_dim); });
}

void ForwardingBackend::SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) {
  Call("silu_mul", [&] { inner_->SiluMul(gu, out, rows, inter); });
}

void ForwardingBackend::GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) {
  Call("gelu_tanh_mul", [&] { inner_->GeluTanhMul(gu, out, rows, inter); });
}

void ForwardingBackend::Scale(float* x, float s, int64_t n) {
  Call("scale", [&] { inner_->Scale(x, s, n); });
}

void ForwardingBackend::PagedAttention(const PagedAttentionArgs& args) {
  Call("paged_attention", [&] { inner_->PagedAttention(args); });
}

void ForwardingBackend::KvStore(const KvStoreArgs& args) {
  Call("kv_store", [&] { inner_->KvStore(args); });
}

void ForwardingBackend::Add(const float* x, float* y, int64_t n) {
  Call("add", [&] { inner_->Add(x, y, n); });
}

void ForwardingBackend::GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) {
  Call("gather_rows", [&] { inner_->GatherRows(x, rows, num_rows, dim, out); });
}

void ForwardingBackend::Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                               int64_t cols) {
  Call("copy_2d", [&] { inner_->Copy2D(src, src_stride, dst, dst_stride, rows, cols); });
}

absl::Status ForwardingBackend::Moe(const MoeArgs& args) {
  absl::Status st;
  Call("moe", [&] { st = inner_->Moe(args); });
  return st;
}

void ForwardingBackend::AllReduceSum(Communicator& comm, float* data, int64_t n) {
  Call("all_reduce_sum", [&] { inner_->AllReduceSum(comm, data, n); });
}

void ForwardingBackend::Send(Communicator& comm, int peer, const float* data, int64_t n) {
  Call("send", [&] { inner_->Send(comm, peer, data, n); });
}

void ForwardingBackend::Recv(Communicator& comm, int peer, float* data, int64_t n) {
  Call("recv", [&] { inner_->Recv(comm, peer, data, n); });
}

}  // namespace duet::kernels

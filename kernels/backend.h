// The kernel backend interface: every op the engine runs, once.
//
//   KernelBackendPtr be = NewCpuBackend(/*threads=*/2);
//   ASSIGN_OR_RETURN(BufferPtr buf, be->DefaultBufferType().Allocate(bytes, "activations"));
//   float* x = static_cast<float*>(buf->base());   // an address in the backend's memory
//   be->RmsNorm(x, w, y, rows, dim, eps);
//
// Memory belongs to the backend (kernels/buffer.h): the activations, the
// scratch, the step's indices and the KV pool an op reads or writes are its
// buffers (pointers into them: base() plus an offset), which the caller
// reaches only by the buffers' explicit copies and never dereferences; the
// weights (WeightMatrix, the norms' and biases' floats, RoPE's inverse
// frequencies) are still host memory the backend reads. Shapes follow
// kernels/cpu/reference.h, whose scalar loops define each op's meaning;
// every backend runs the one op harness (kernels/backend_ops_test.cc)
// against them. Calls are made from one thread at a time per backend (the
// engine's step loop); a backend may use its own threads inside a call.
#ifndef DUET_KERNELS_BACKEND_H_
#define DUET_KERNELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/buffer.h"
#include "kernels/communicator.h"
#include "kernels/dtype.h"
#include "kernels/moe.h"

namespace duet::kernels {

// The ops that take a weight matrix in any dtype (kernels/dtype.h).
enum class WeightOp { kGemm, kEmbedding };

// Every op's name, in the order KernelBackend declares them: what
// Implements is asked, what ForwardingBackend's hook is given, and what the
// op harness (kernels/backend_ops_test.cc) must cover.
inline constexpr std::string_view kOpNames[] = {
    "gemm", "embedding", "rms_norm", "rope", "silu_mul", "gelu_tanh_mul", "scale", "paged_attention", "kv_store",
    "add", "gather_rows", "copy_2d", "moe", "all_reduce_sum", "send", "recv"};

// A recorded sequence of a backend's ops (KernelBackend::BeginCapture).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;

  virtual std::string Name() const = 0;
  // Whether this backend runs the op named `op` (kOpNames). A backend being
  // built runs some (the CUDA one: rms_norm, rope); NewBackend offers only
  // backends that run them all, and calling one it lacks is a bug.
  virtual bool Implements(std::string_view op) const { return true; }
  // Where this backend's ops expect their memory (kernels/buffer.h): the
  // KV pool, the activations and the step's indices are its buffers.
  virtual BufferType& DefaultBufferType() = 0;

  // Whether the weight ops run on weights of `dtype` here (as ggml's
  // supports_op): the others return Unimplemented.
  virtual bool Supports(WeightOp op, DType dtype) const = 0;
  // c[m, w.n] = a[m, w.k] * w^T (+ bias) (+ c if accumulate), w in any
  // supported dtype; each output the F32 Gemm's over Dequantize(w), bit for
  // bit where the F32 Gemm is batch-invariant.
  virtual absl::Status Gemm(const float* a, const WeightMatrix& w, const float* bias, float* c, int64_t m,
                            bool accumulate) = 0;
  // out[t, :] = row ids[t] of `table` ([vocab][dim]), as floats.
  virtual absl::Status EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, float* out,
                                       int64_t num_tokens) = 0;
  virtual void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                       float eps) = 0;
  virtual void Rope(float* x, const int32_t* positions, const float* inv_freq,
                    int64_t num_tokens, int64_t num_heads, int64_t head_dim) = 0;
  virtual void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) = 0;
  // out = gelu_tanh(gate) * up, gate and up side by side as SiluMul's (Gemma).
  virtual void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) = 0;
  // x[i] *= s for i < n (Gemma's embedding scale).
  virtual void Scale(float* x, float s, int64_t n) = 0;
  // The KV pool's dtype when the operator names none, and whether
  // PagedAttention reads a pool of `dtype` (kernels/kv_layout.h).
  virtual DType DefaultKvDType() const = 0;
  virtual bool SupportsKv(DType dtype) const = 0;
  virtual void PagedAttention(const PagedAttentionArgs& args) = 0;
  // A batch's new K and V into the pool (kernels/attention.h), every KV dtype.
  virtual void KvStore(const KvStoreArgs& args) = 0;
  // y[i] += x[i] for i < n (a residual or a tensor-parallel partial sum).
  virtual void Add(const float* x, float* y, int64_t n) = 0;
  // out[i, :] = x[rows[i], :] for i < num_rows (the rows whose logits are
  // wanted); rows index x's rows, each of `dim` floats.
  virtual void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) = 0;
  // dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols
  // (the q/k/v split of one GEMM's rows, a vocabulary slice's logits into
  // their columns); the two must not overlap.
  virtual void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                      int64_t cols) = 0;

  // The mixture-of-experts MLP (kernels/moe.h): each row's chosen experts,
  // weighted; every weight dtype Gemm runs. Each row the same bits whatever
  // the other rows chose where the Gemm is batch-invariant.
  virtual absl::Status Moe(const MoeArgs& args) = 0;

  // Collectives (kernels/communicator.h) on this backend's memory, with the
  // communicator's meaning: `data` replaced on every rank by the sum in rank
  // order; a sent run of floats received whole by its peer.
  virtual void AllReduceSum(Communicator& comm, float* data, int64_t n) = 0;
  virtual void Send(Communicator& comm, int peer, const float* data, int64_t n) = 0;
  virtual void Recv(Communicator& comm, int peer, float* data, int64_t n) = 0;

  // Resident weights: the host arrays a model holds for its lifetime (its
  // weight matrices' values, scales and zeros, biases, norm gains, RoPE
  // frequencies), registered once so that a device backend keeps a copy in
  // its memory and its ops read that, not the host array copied with each
  // op (a copy a step graph could not record). The array must not change
  // until ReleaseResident(host), which the holder calls before freeing it.
  // No-ops where the backend reads host memory (the CPU's).
  virtual absl::Status MakeResident(const void* host, int64_t bytes) { return absl::OkStatus(); }
  virtual void ReleaseResident(const void* host) {}

  // Step graphs (CUDA graphs): the ops issued between BeginCapture and
  // EndCapture are recorded, not run, and Replay runs them again as
  // recorded (the same pointers and sizes, over whatever the buffers hold
  // then). Unimplemented where the backend has none (the CPU's). EndCapture
  // fails, keeping nothing, where an op could not be recorded (it would
  // have had to allocate or synchronize); Replay fails with
  // FailedPrecondition once the graph is stale (memory it recorded has
  // moved since), and the caller captures again.
  virtual absl::Status BeginCapture() { return absl::UnimplementedError(Name() + " has no step graphs"); }
  virtual absl::StatusOr<std::unique_ptr<StepGraph>> EndCapture() {
    return absl::UnimplementedError(Name() + " has no step graphs");
  }
  virtual absl::Status Replay(StepGraph& graph) { return absl::UnimplementedError(Name() + " has no step graphs"); }
};

using KernelBackendPtr = std::unique_ptr<KernelBackend>;

}  // namespace duet::kernels

#endif  // DUET_KERNELS_BACKEND_H_

#include "kernels/cuda/cuda_backend.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/kv_layout.h"

namespace duet::kernels::cuda {
namespace {

// "what: cudaErrorX text" (and, emulated, the fault the executor found).
std::string ErrorText(cudaError_t e, const std::string& what) {
  std::string text = absl::StrCat(what, ": ", cudaGetErrorString(e));
#if defined(DUET_SIMT)
  if (e == cudaErrorLaunchFailure) absl::StrAppend(&text, ": ", simt::LastFault());
#endif
  return text;
}

absl::Status Check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(ErrorText(e, what));
  if (e == cudaErrorInvalidValue) return absl::InvalidArgumentError(ErrorText(e, what));
  return absl::InternalError(ErrorText(e, what));
}

class DeviceMemory;

class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(const DeviceMemory* type, void* memory, int64_t bytes, std::string name)
      : type_(type), memory_(memory), bytes_(bytes), name_(std::move(name)) {}
  ~DeviceBuffer() override {
    if (cudaError_t e = cudaFree(memory_); e != cudaSuccess) LOG(WARNING) << ErrorText(e, "cudaFree " + name_);
  }

  const BufferType& type() const override;
  int64_t bytes() const override { return bytes_; }
  const std::string& name() const override { return name_; }
  void* base() const override { return memory_; }

  absl::Status Write(int64_t offset, const void* host, int64_t bytes) override {
    RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
    return Check(cudaMemcpy(At(offset), host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice), Say("write"));
  }
  absl::Status Read(int64_t offset, void* host, int64_t bytes) const override {
    RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
    return Check(cudaMemcpy(host, At(offset), static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), Say("read"));
  }
  absl::Status Fill(int64_t offset, int64_t bytes, uint8_t value) override {
    RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
    return Check(cudaMemset(At(offset), value, static_cast<size_t>(bytes)), Say("fill"));
  }
  absl::Status CopyFrom(const Buffer& src, int64_t src_offset, int64_t dst_offset, int64_t bytes) override {
    const bool device = &src.type() == &type();
    if (!device && !src.type().IsHost()) {
      return absl::UnimplementedError(
          absl::StrCat(name_, ": cannot copy from ", src.name(), " (", src.type().Name(), " memory)"));
    }
    RETURN_IF_ERROR(CheckRange(src, src_offset, bytes));
    RETURN_IF_ERROR(CheckRange(*this, dst_offset, bytes));
    return Check(cudaMemcpy(At(dst_offset), static_cast<const uint8_t*>(src.base()) + src_offset,
                            static_cast<size_t>(bytes), device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice),
                 Say("copy into"));
  }

 private:
  uint8_t* At(int64_t offset) const { return static_cast<uint8_t*>(memory_) + offset; }
  std::string Say(const char* what) const { return absl::StrCat(what, " ", name_); }

  const DeviceMemory* const type_;
  void* const memory_;
  const int64_t bytes_;
  const std::string name_;
};

class DeviceMemory final : public BufferType {
 public:
  std::string Name() const override { return "cuda device"; }
  bool IsHost() const override { return false; }
  absl::StatusOr<BufferPtr> Allocate(int64_t bytes, const std::string& name) override {
    if (bytes <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": a buffer of ", bytes, " bytes"));
    void* memory = nullptr;
    RETURN_IF_ERROR(Check(cudaMalloc(&memory, static_cast<size_t>(bytes)), absl::StrCat("cudaMalloc ", name)));
    // Zero-filled, as every BufferType's buffers are.
    if (cudaError_t e = cudaMemset(memory, 0, static_cast<size_t>(bytes)); e != cudaSuccess) {
      cudaFree(memory);
      return Check(e, absl::StrCat("cudaMemset ", name));
    }
    return std::make_unique<DeviceBuffer>(this, memory, bytes, name);
  }
};

const BufferType& DeviceBuffer::type() const { return *type_; }

// The ops (kOpNames) the backend runs so far.
constexpr std::string_view kRuns[] = {"rms_norm", "rope",       "silu_mul",    "gelu_tanh_mul", "scale",
                                      "kv_store", "add",        "gather_rows", "copy_2d"};

class CudaBackend final : public KernelBackend {
 public:
  explicit CudaBackend(cudaStream_t stream) : stream_(stream) {}
  ~CudaBackend() override {
    staged_.reset();
    cudaStreamDestroy(stream_);
  }

#if defined(DUET_SIMT)
  std::string Name() const override { return "cuda-simt"; }
#else
  std::string Name() const override { return "cuda"; }
#endif
  bool Implements(std::string_view op) const override {
    for (std::string_view runs : kRuns) {
      if (op == runs) return true;
    }
    return false;
  }
  BufferType& DefaultBufferType() override { return memory_; }
  bool Supports(WeightOp, DType) const override { return false; }
  DType DefaultKvDType() const override { return DType::kF32; }
  // KvStore writes every KV dtype; PagedAttention, which will read them, is
  // not here yet (Implements).
  bool SupportsKv(DType dtype) const override { return IsKvDType(dtype); }

  absl::Status Gemm(const float*, const WeightMatrix&, const float*, float*, int64_t, bool) override {
    return absl::UnimplementedError("the CUDA backend runs no GEMM yet");
  }
  absl::Status EmbeddingLookup(const WeightMatrix&, const int32_t*, float*, int64_t) override {
    return absl::UnimplementedError("the CUDA backend runs no embedding lookup yet");
  }
  void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override {
    const float* dw = Stage(w, dim);
    Launched(LaunchRmsNorm(x, dw, y, rows, dim, eps, stream_), "RmsNorm");
  }
  void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens, int64_t num_heads,
            int64_t head_dim) override {
    const float* dfreq = Stage(inv_freq, head_dim / 2);
    Launched(LaunchRope(x, positions, dfreq, num_tokens, num_heads, head_dim, stream_), "Rope");
  }
  void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    Launched(LaunchSiluMul(gu, out, rows, inter, stream_), "SiluMul");
  }
  void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    Launched(LaunchGeluTanhMul(gu, out, rows, inter, stream_), "GeluTanhMul");
  }
  void Scale(float* x, float s, int64_t n) override { Launched(LaunchScale(x, s, n, stream_), "Scale"); }
  void PagedAttention(const PagedAttentionArgs&) override { Missing("paged_attention"); }
  void KvStore(const KvStoreArgs& a) override {
    const KvLayout& l = a.layout;
    const KvPoolShape shape{.element = l.dtype == DType::kBF16  ? KvPoolShape::kBF16
                                       : l.dtype == DType::kF16 ? KvPoolShape::kF16
                                                                : KvPoolShape::kF32,
                            .block_size = l.block_size,
                            .head_dim = l.head_dim,
                            .block_stride = l.BlockStride(),
                            .layer_stride = l.LayerStride(),
                            .kv_stride = l.KvStride(),
                            .head_stride = l.HeadStride()};
    Launched(LaunchKvStore(a.k, a.v, a.slots, a.rows, a.kv, shape, a.layer, a.kv_head_begin, a.KvHeads(), stream_),
             "KvStore");
  }
  void Add(const float* x, float* y, int64_t n) override { Launched(LaunchAdd(x, y, n, stream_), "Add"); }
  void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) override {
    Launched(LaunchGatherRows(x, rows, num_rows, dim, out, stream_), "GatherRows");
  }
  void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
              int64_t cols) override {
    Launched(LaunchCopy2D(src, src_stride, dst, dst_stride, rows, cols, stream_), "Copy2D");
  }
  absl::Status Moe(const MoeArgs&) override {
    return absl::UnimplementedError("the CUDA backend runs no mixture of experts yet");
  }
  void AllReduceSum(Communicator&, float*, int64_t) override { Missing("all_reduce_sum"); }
  void Send(Communicator&, int, const float*, int64_t) override { Missing("send"); }
  void Recv(Communicator&, int, float*, int64_t) override { Missing("recv"); }

 private:
  [[noreturn]] static void Missing(const char* op) {
    LOG(FATAL) << "the CUDA backend does not run " << op << " yet (Implements says so)";
    abort();
  }
  // A launch error is a bug in the caller's shapes or the launcher: the ops
  // return nothing, so it stops the process with what CUDA said.
  static void Launched(cudaError_t e, const char* op) { CHECK_EQ(e, cudaSuccess) << ErrorText(e, op); }

  // `n` host floats copied to device scratch on the stream, for the op that follows.
  const float* Stage(const float* host, int64_t n) {
    const int64_t bytes = std::max<int64_t>(n, 1) * static_cast<int64_t>(sizeof(float));
    if (staged_ == nullptr || staged_->bytes() < bytes) {
      absl::StatusOr<BufferPtr> b = memory_.Allocate(bytes, "staged weights");
      CHECK(b.ok()) << b.status();
      staged_ = *std::move(b);
    }
    if (n > 0) {
      Launched(cudaMemcpyAsync(staged_->base(), host, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice,
                               stream_),
               "staging weights");
    }
    return static_cast<const float*>(staged_->base());
  }

  DeviceMemory memory_;
  cudaStream_t stream_;
  BufferPtr staged_;
};

}  // namespace

absl::StatusOr<KernelBackendPtr> NewCudaBackend() {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return absl::UnavailableError(ErrorText(e, "cudaGetDeviceCount"));
  }
  if (devices == 0) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device visible");
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(Check(cudaStreamCreate(&stream), "cudaStreamCreate"));
  return KernelBackendPtr(std::make_unique<CudaBackend>(stream));
}

}  // namespace duet::kernels::cuda

#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_fixed.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/moe.cuh"
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

// The attention kernel reads the engine's AttentionSeq array as DeviceSeq.
static_assert(sizeof(DeviceSeq) == sizeof(AttentionSeq));
static_assert(offsetof(DeviceSeq, first_row) == offsetof(AttentionSeq, first_row));
static_assert(offsetof(DeviceSeq, num_tokens) == offsetof(AttentionSeq, num_tokens));
static_assert(offsetof(DeviceSeq, start_pos) == offsetof(AttentionSeq, start_pos));
static_assert(offsetof(DeviceSeq, block_table) == offsetof(AttentionSeq, block_table));

KvPoolShape ShapeOf(const KvLayout& l) {
  return {.element = l.dtype == DType::kBF16  ? KvPoolShape::kBF16
                     : l.dtype == DType::kF16 ? KvPoolShape::kF16
                                              : KvPoolShape::kF32,
          .block_size = l.block_size,
          .head_dim = l.head_dim,
          .block_stride = l.BlockStride(),
          .layer_stride = l.LayerStride(),
          .kv_stride = l.KvStride(),
          .head_stride = l.HeadStride()};
}

DeviceWeights::Type TypeOf(DType d) {
  switch (d) {
    case DType::kF32: return DeviceWeights::kF32;
    case DType::kBF16: return DeviceWeights::kBF16;
    case DType::kF16: return DeviceWeights::kF16;
    case DType::kQ8: return DeviceWeights::kQ8;
    case DType::kQ4: return DeviceWeights::kQ4;
    case DType::kQ4Z: return DeviceWeights::kQ4Z;
  }
  return DeviceWeights::kF32;
}

// An instantiated CUDA graph and the scratch generation it recorded.
struct CudaGraph final : StepGraph {
  CudaGraph(cudaGraphExec_t e, uint64_t g) : exec(e), generation(g) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec); }
  cudaGraphExec_t exec;
  uint64_t generation;
};

class CudaBackend final : public KernelBackend {
 public:
  CudaBackend(cudaStream_t stream, const CudaBackendOptions& options) : stream_(stream), options_(options) {}
  ~CudaBackend() override {
    for (BufferPtr& b : scratch_) b.reset();
    cudaStreamDestroy(stream_);
  }

#if defined(DUET_SIMT)
  std::string Name() const override { return "cuda-simt"; }
#else
  std::string Name() const override { return "cuda"; }
#endif
  BufferType& DefaultBufferType() override { return memory_; }
  // Every dtype, as F32 products: the weights widened on the device (bit
  // for bit DequantizeRow's values), then the GEMM seam's F32 GEMM.
  bool Supports(WeightOp, DType) const override { return true; }
  DType DefaultKvDType() const override { return bf16() ? DType::kBF16 : DType::kF32; }
  bool SupportsKv(DType dtype) const override { return IsKvDType(dtype); }

  absl::Status Gemm(const float* a, const WeightMatrix& w, const float* bias, float* c, int64_t m,
                    bool accumulate) override {
    if (m < 0) return absl::InvalidArgumentError(absl::StrCat("a GEMM of ", m, " rows"));
    if (m == 0 || w.n == 0) return absl::OkStatus();
    const int64_t weights = w.n * w.k, acts = m * w.k;
    float* widened = static_cast<float*>(Scratch(kWidened, weights * static_cast<int64_t>(sizeof(float))));
    RETURN_IF_ERROR(Check(LaunchDequantize(StageWeights(w), widened, stream_), "widening GEMM weights"));
    if (options_.deterministic) {
      // BF16: the inputs' BF16 values, as F32 (their products are exact).
      const float* x = a;
      if (bf16()) {
        float* rounded = static_cast<float*>(Scratch(kActs, acts * static_cast<int64_t>(sizeof(float))));
        RETURN_IF_ERROR(Check(LaunchRoundThroughBf16(a, rounded, acts, stream_), "rounding GEMM inputs"));
        RETURN_IF_ERROR(Check(LaunchRoundThroughBf16(widened, widened, weights, stream_), "rounding GEMM weights"));
        x = rounded;
      }
      RETURN_IF_ERROR(Check(LaunchFixedOrderGemm(x, widened, c, m, w.n, w.k, accumulate, stream_), "GEMM"));
    } else {
      GemmArgs g{.m = m, .n = w.n, .k = w.k, .a = a, .b = widened, .c = c, .beta = accumulate ? 1.0f : 0.0f};
      if (bf16()) {
        uint16_t* x = static_cast<uint16_t*>(Scratch(kActs, acts * 2));
        uint16_t* wb = static_cast<uint16_t*>(Scratch(kWeightsBf16, weights * 2));
        RETURN_IF_ERROR(Check(LaunchToBf16(a, x, acts, stream_), "rounding GEMM inputs"));
        RETURN_IF_ERROR(Check(LaunchToBf16(widened, wb, weights, stream_), "rounding GEMM weights"));
        g.a = x;
        g.b = wb;
        g.a_type = g.b_type = GemmType::kBF16;
      }
      RETURN_IF_ERROR(Check(cuda::Gemm(g, stream_), "GEMM"));
    }
    if (bias == nullptr) return absl::OkStatus();
    return Check(LaunchAddBias(StageFloats(kBias, bias, w.n), c, m, w.n, stream_), "GEMM bias");
  }
  absl::Status EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, float* out,
                               int64_t num_tokens) override {
    if (num_tokens < 0) return absl::InvalidArgumentError(absl::StrCat("an embedding of ", num_tokens, " tokens"));
    if (num_tokens == 0) return absl::OkStatus();
    return Check(LaunchEmbedding(StageWeights(table), ids, num_tokens, out, stream_), "embedding lookup");
  }
  void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override {
    const float* dw = StageFloats(kValues, w, dim);
    Launched(LaunchRmsNorm(x, dw, y, rows, dim, eps, stream_), "RmsNorm");
  }
  void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens, int64_t num_heads,
            int64_t head_dim) override {
    const float* dfreq = StageFloats(kValues, inv_freq, head_dim / 2);
    Launched(LaunchRope(x, positions, dfreq, num_tokens, num_heads, head_dim, stream_), "Rope");
  }
  void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    Launched(LaunchSiluMul(gu, out, rows, inter, stream_), "SiluMul");
  }
  void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    Launched(LaunchGeluTanhMul(gu, out, rows, inter, stream_), "GeluTanhMul");
  }
  void Scale(float* x, float s, int64_t n) override { Launched(LaunchScale(x, s, n, stream_), "Scale"); }
  void PagedAttention(const PagedAttentionArgs& a) override {
    const AttentionParams p{.q = a.q,
                            .out = a.out,
                            .kv = a.kv,
                            .pool = ShapeOf(a.layout),
                            .layer = a.layer,
                            .num_q_heads = a.num_q_heads,
                            .kv_head_begin = a.kv_head_begin,
                            .kv_heads = a.KvHeads(),
                            .scale = a.scale,
                            .softcap = a.softcap,
                            .window = a.window,
                            .seqs = reinterpret_cast<const DeviceSeq*>(a.seqs),
                            .num_seqs = a.num_seqs};
    Launched(LaunchPagedAttention(p, stream_), "PagedAttention");
  }
  void KvStore(const KvStoreArgs& a) override {
    Launched(LaunchKvStore(a.k, a.v, a.slots, a.rows, a.kv, ShapeOf(a.layout), a.layer, a.kv_head_begin,
                           a.KvHeads(), stream_),
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
  // Routing on the device, then every expert's MLP over every row (not yet
  // grouped GEMMs over the rows that chose it: the host does not see the
  // choices without waiting for them), each row's outputs kept where it
  // chose that expert and summed in its order of choice.
  absl::Status Moe(const MoeArgs& a) override {
    if (a.rows < 0 || a.num_experts <= 0 || a.top_k <= 0 || a.top_k > a.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("MoE of ", a.rows, " rows, top ", a.top_k, " of ", a.num_experts, " experts"));
    }
    if (a.rows == 0) return absl::OkStatus();
    const int64_t H = a.hidden(), I = a.inter(), K = a.top_k;
    const MoeScratch s = MoeScratchFor(a.rows, K, a.num_experts, H, I);
    uint8_t* sb = static_cast<uint8_t*>(a.scratch);
    int32_t* expert = reinterpret_cast<int32_t*>(sb + s.expert);
    float* weight = reinterpret_cast<float*>(sb + s.weight);
    float* gu = reinterpret_cast<float*>(sb + s.gu);     // [rows][2I] of its [pairs][2I]
    float* act = reinterpret_cast<float*>(sb + s.act);   // [rows][I]
    float* y = reinterpret_cast<float*>(sb + s.xs);      // [rows][H]: one expert's outputs
    float* slots = reinterpret_cast<float*>(sb + s.ys);  // [pairs][H]: each choice's
    RETURN_IF_ERROR(Check(LaunchMoeRoute(a.scores, a.rows, a.num_experts, K, a.renormalize, expert, weight, stream_),
                          "MoE routing"));
    for (int64_t e = 0; e < a.num_experts; ++e) {
      RETURN_IF_ERROR(Gemm(a.x, a.experts[e].gate_up, nullptr, gu, a.rows, false));
      SiluMul(gu, act, a.rows, I);
      RETURN_IF_ERROR(Gemm(act, a.experts[e].down, nullptr, y, a.rows, false));
      RETURN_IF_ERROR(Check(LaunchMoeGather(y, static_cast<int32_t>(e), expert, a.rows, K, H, slots, stream_),
                            "MoE gather"));
    }
    return Check(LaunchMoeCombine(weight, slots, a.rows, K, H, a.out, stream_), "MoE sum");
  }
  // The collectives through host memory, with the communicator's meaning
  // (the thread communicator in tests; an NCCL communicator on device
  // memory is not here yet): the stream's work waited for, the floats
  // copied out, exchanged, and copied back in.
  void AllReduceSum(Communicator& comm, float* data, int64_t n) override {
    std::vector<float> host = ToHost(data, n);
    comm.AllReduceSum(host.data(), n);
    ToDevice(host, data);
  }
  void Send(Communicator& comm, int peer, const float* data, int64_t n) override {
    comm.Send(peer, ToHost(data, n).data(), n);
  }
  void Recv(Communicator& comm, int peer, float* data, int64_t n) override {
    std::vector<float> host(static_cast<size_t>(n));
    comm.Recv(peer, host.data(), n);
    ToDevice(host, data);
  }

 private:
  // A launch error is a bug in the caller's shapes or the launcher: the ops
  // return nothing, so it stops the process with what CUDA said.
  // A launch's error is fatal, except while capturing: then the capture
  // fails (EndCapture says why) and nothing ran.
  void Launched(cudaError_t e, const char* op) {
    if (e != cudaSuccess && capturing_) {
      if (capture_failed_.empty()) capture_failed_ = ErrorText(e, op);
      return;
    }
    CHECK_EQ(e, cudaSuccess) << ErrorText(e, op);
  }

  std::vector<float> ToHost(const float* data, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    if (n > 0) {
      Launched(cudaMemcpyAsync(host.data(), data, host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
               "collective's copy out");
      Launched(cudaStreamSynchronize(stream_), "collective's copy out");
    }
    return host;
  }
  // The copy reads `host` before it returns (pageable memory is staged).
  void ToDevice(const std::vector<float>& host, float* data) {
    if (host.empty()) return;
    Launched(cudaMemcpyAsync(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
             "collective's copy in");
  }

  // Resident copies share chunks of device memory (one allocation per
  // 16 MiB, not one per array), each freed when its last copy goes.
  absl::Status MakeResident(const void* host, int64_t bytes) override {
    if (host == nullptr || bytes <= 0) return absl::OkStatus();
    if (capturing_) return absl::FailedPreconditionError("weights made resident while capturing a step graph");
    ReleaseResident(host);
    constexpr int64_t kChunk = int64_t{16} << 20, kAlign = 256;
    const int64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (chunks_.empty() || chunks_.back().used + need > chunks_.back().memory->bytes()) {
      ASSIGN_OR_RETURN(BufferPtr memory, memory_.Allocate(std::max(kChunk, need), "resident weights"));
      chunks_.push_back({std::move(memory), 0, 0});
    }
    Chunk& c = chunks_.back();
    RETURN_IF_ERROR(c.memory->Write(c.used, host, bytes));
    resident_[reinterpret_cast<uintptr_t>(host)] = {&c, c.used, bytes};
    c.used += need;
    ++c.copies;
    return absl::OkStatus();
  }
  void ReleaseResident(const void* host) override {
    auto it = resident_.find(reinterpret_cast<uintptr_t>(host));
    if (it == resident_.end()) return;
    ++generation_;  // Graphs may have recorded the copy.
    Chunk* c = it->second.chunk;
    resident_.erase(it);
    if (--c->copies > 0) return;
    for (auto ch = chunks_.begin(); ch != chunks_.end(); ++ch) {
      if (&*ch == c) {
        chunks_.erase(ch);
        break;
      }
    }
  }

  absl::Status BeginCapture() override {
    if (capturing_) return absl::FailedPreconditionError("a step graph is being captured already");
    RETURN_IF_ERROR(Check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "beginning a capture"));
    capturing_ = true;
    capture_failed_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<StepGraph>> EndCapture() override {
    if (!capturing_) return absl::FailedPreconditionError("no step graph is being captured");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    cudaGetLastError();  // An invalidated capture leaves its error behind.
    auto graph_done = [&] {
      if (graph != nullptr) cudaGraphDestroy(graph);
    };
    if (!capture_failed_.empty()) {
      graph_done();
      return absl::FailedPreconditionError(absl::StrCat("step graph not captured: ", capture_failed_));
    }
    if (ended != cudaSuccess) {
      graph_done();
      return Check(ended, "ending a capture");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    graph_done();
    RETURN_IF_ERROR(Check(made, "instantiating a step graph"));
    return std::unique_ptr<StepGraph>(std::make_unique<CudaGraph>(exec, generation_));
  }
  absl::Status Replay(StepGraph& graph) override {
    auto* g = dynamic_cast<CudaGraph*>(&graph);
    if (g == nullptr) return absl::InvalidArgumentError("not a step graph of this backend");
    if (g->generation != generation_) {
      return absl::FailedPreconditionError("the step graph is stale: memory it recorded (scratch or a resident copy) moved since");
    }
    return Check(cudaGraphLaunch(g->exec, stream_), "replaying a step graph");
  }

  // The device copy of [host, host + bytes) where a resident array holds it.
  void* ResidentCopy(const void* host, int64_t bytes) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(host);
    auto it = resident_.upper_bound(at);
    if (it == resident_.begin() || bytes <= 0) return nullptr;
    --it;
    const Copy& copy = it->second;
    if (at + static_cast<uintptr_t>(bytes) > it->first + static_cast<uintptr_t>(copy.bytes)) return nullptr;
    return static_cast<uint8_t*>(copy.chunk->memory->base()) + copy.offset + (at - it->first);
  }

  // Device scratch, one buffer per use, grown as needed (a buffer is freed
  // only by cudaFree, which waits for the work that reads it).
  enum Slot { kValues, kScales, kZeros, kBias, kWidened, kActs, kWeightsBf16, kSlots };
  bool bf16() const { return options_.activation_dtype == DType::kBF16; }
  void* Scratch(Slot slot, int64_t bytes) {
    BufferPtr& b = scratch_[slot];
    if (b == nullptr || b->bytes() < bytes) {
      if (capturing_) {  // No allocation inside a graph: run the step eagerly first.
        if (capture_failed_.empty()) capture_failed_ = "a scratch buffer had to grow while capturing";
        return b == nullptr ? nullptr : b->base();
      }
      ++generation_;  // Graphs recorded the old buffer.
      b.reset();
      absl::StatusOr<BufferPtr> grown = memory_.Allocate(std::max<int64_t>(bytes, 1), "scratch");
      CHECK(grown.ok()) << grown.status();
      b = *std::move(grown);
    }
    return b->base();
  }
  // The device copy of `bytes` of host memory for the ops that follow: the
  // resident copy where there is one, else a copy into scratch `slot` on the
  // stream (a host array no one made resident, such as a test's).
  void* Stage(Slot slot, const void* host, int64_t bytes) {
    if (void* resident = ResidentCopy(host, bytes)) return resident;
    void* at = Scratch(slot, bytes);
    if (bytes > 0) {
      Launched(cudaMemcpyAsync(at, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
               "staging weights");
    }
    return at;
  }
  const float* StageFloats(Slot slot, const float* host, int64_t n) {
    return static_cast<const float*>(Stage(slot, host, n * static_cast<int64_t>(sizeof(float))));
  }
  // A weight matrix's arrays staged on the device.
  DeviceWeights StageWeights(const WeightMatrix& w) {
    DeviceWeights d{.dtype = TypeOf(w.dtype), .n = w.n, .k = w.k, .row_bytes = w.RowBytes()};
    d.values = Stage(kValues, w.values, w.n * d.row_bytes);
    const int64_t blocks = w.n * QuantBlocks(w.k);
    if (w.scales != nullptr) d.scales = StageFloats(kScales, w.scales, blocks);
    if (w.zeros != nullptr) d.zeros = static_cast<const uint8_t*>(Stage(kZeros, w.zeros, blocks));
    return d;
  }

  DeviceMemory memory_;
  cudaStream_t stream_;
  const CudaBackendOptions options_;
  bool capturing_ = false;
  std::string capture_failed_;  // why the capture under way cannot be kept
  uint64_t generation_ = 0;     // bumped when scratch or a resident copy moves: older graphs are stale
  struct Chunk {
    BufferPtr memory;
    int64_t used = 0;  // bytes handed out (the tail is free)
    int copies = 0;    // live copies in it
  };
  struct Copy {
    Chunk* chunk;
    int64_t offset, bytes;
  };
  std::list<Chunk> chunks_;              // stable addresses
  std::map<uintptr_t, Copy> resident_;  // by host address
  BufferPtr scratch_[kSlots];
};

}  // namespace

absl::StatusOr<KernelBackendPtr> NewCudaBackend(const CudaBackendOptions& options) {
  if (options.activation_dtype != DType::kF32 && options.activation_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA backend's activations are f32 or bf16, not ",
                                                   DTypeName(options.activation_dtype)));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return absl::UnavailableError(ErrorText(e, "cudaGetDeviceCount"));
  }
  if (devices == 0) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device visible");
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(Check(cudaStreamCreate(&stream), "cudaStreamCreate"));
  return KernelBackendPtr(std::make_unique<CudaBackend>(stream, options));
}

}  // namespace duet::kernels::cuda

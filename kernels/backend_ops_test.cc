// The op harness: every op of kernels/backend.h, on every backend present,
// against the scalar reference (kernels/cpu/reference.h) by normalized mean
// squared error with a tolerance per op and dtype (0: the same bits), on
// odd shapes. Inputs and outputs live in the backend's own buffers, reached
// only by their copies, so a device backend runs the cases unchanged.
//
// Backends: "cpu" and "cpu-fastest" (NewBackend's CPU kernels, batch
// invariant and the benchmarks' mix), "protected" (the CPU one with its
// buffers PROT_NONE outside ops, kernels/testing/protected_backend.h) and
// "cuda" (the CUDA backend's ops so far, on the SIMT executor here). The
// CPU ones run with AVX-512 on and off (the AVX2 paths), and Bazel runs
// the whole binary again with DUET_NO_AVX2=1 for the scalar paths; "cuda"
// runs once.
//
// A new op costs one entry of Cases(): the last test fails until every op
// ForwardingBackend names has run in some case.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/simd.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/dtype.h"
#include "kernels/factory.h"
#include "kernels/forwarding_backend.h"
#include "kernels/rope.h"
#include "kernels/testing/op_testing.h"
#include "kernels/testing/protected_backend.h"

namespace duet::kernels {
namespace {

using testing::PoolOf;
using testing::Random;

// got against want: the same bits where tolerance is 0, else NMSE at most it.
void Expect(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  if (tolerance == 0) {
    CHECK(testing::SameBits(got.data(), want.data(), got.size()));
  } else {
    const double e = testing::Nmse(got, want);
    INFO("NMSE " << e << ", tolerance " << tolerance);
    CHECK(e <= tolerance);
  }
}

// Buffers of one backend, each holding one array: in by Put, out by Get.
class Device {
 public:
  explicit Device(KernelBackend& be) : be_(be) {}

  template <typename T>
  T* Put(const std::vector<T>& host) {
    const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
    BufferPtr& b = buffers_.emplace_back(Allocate(bytes));
    REQUIRE(b->Write(0, host.data(), bytes).ok());
    return static_cast<T*>(b->base());
  }
  template <typename T>
  std::vector<T> Get(const T* at, size_t n) const {
    std::vector<T> out(n);
    for (const BufferPtr& b : buffers_) {
      const int64_t offset = reinterpret_cast<const uint8_t*>(at) - static_cast<const uint8_t*>(b->base());
      if (offset >= 0 && offset < b->bytes()) {
        REQUIRE(b->Read(offset, out.data(), static_cast<int64_t>(n * sizeof(T))).ok());
        return out;
      }
    }
    FAIL("not in a buffer of this device");
    return out;
  }

 private:
  BufferPtr Allocate(int64_t bytes) {
    absl::StatusOr<BufferPtr> b = be_.DefaultBufferType().Allocate(std::max<int64_t>(bytes, 1), "harness");
    REQUIRE(b.ok());
    return *std::move(b);
  }

  KernelBackend& be_;
  std::vector<BufferPtr> buffers_;
};

struct Env {
  KernelBackend& be;
  KernelBackend& peer;  // Another backend of the same kind: a collective's other rank.
};

struct OpCase {
  std::vector<std::string> ops;  // The kOpNames it runs.
  std::function<void(Env&)> run;
};

void GemmCase(Env& env) {
  // The kernels multiply by exactly Dequantize's values, so only float
  // summation separates them from the reference, in every dtype.
  constexpr double kTolerance = 1e-11;
  Device dev(env.be);
  for (DType dtype : kAllDTypes) {
    if (!env.be.Supports(WeightOp::kGemm, dtype)) continue;
    for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{
             {1, 1, 1}, {1, 70, 37}, {3, 33, 64}, {9, 129, 100}, {33, 64, 250}, {2, 16, 512}}) {
      const std::vector<float> wf = Random(static_cast<size_t>(n) * k, 11);
      const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
      const std::vector<float> a = Random(static_cast<size_t>(m) * k, 12), bias = Random(n, 13),
                               c0 = Random(static_cast<size_t>(m) * n, 14);
      for (bool acc : {false, true}) {
        for (bool with_bias : {false, true}) {
          INFO(DTypeName(dtype) << " m=" << m << " n=" << n << " k=" << k << " acc=" << acc << " bias=" << with_bias);
          float* c = dev.Put(c0);
          // The bias is host memory, as the weights are (backend.h).
          REQUIRE(env.be.Gemm(dev.Put(a), hw.view(), with_bias ? bias.data() : nullptr, c, m, acc).ok());
          std::vector<float> want = c0;
          ref::Gemm(a.data(), hw.view(), want.data(), m, acc);
          for (int i = 0; with_bias && i < m; ++i) {
            for (int j = 0; j < n; ++j) want[static_cast<size_t>(i * n + j)] += bias[static_cast<size_t>(j)];
          }
          Expect(dev.Get(c, want.size()), want, kTolerance);
        }
      }
    }
  }
}

void EmbeddingCase(Env& env) {
  Device dev(env.be);
  const int vocab = 50, dim = 70;
  const std::vector<float> t = Random(vocab * dim, 21);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  for (DType dtype : kAllDTypes) {
    if (!env.be.Supports(WeightOp::kEmbedding, dtype)) continue;
    INFO(DTypeName(dtype));
    const HostWeights hw = QuantizeWeights(t.data(), vocab, dim, dtype);
    const std::vector<float> dense = Dequantize(hw.view());
    float* out = dev.Put(std::vector<float>(ids.size() * dim));
    REQUIRE(env.be.EmbeddingLookup(hw.view(), dev.Put(ids), out, static_cast<int64_t>(ids.size())).ok());
    std::vector<float> want;
    for (int32_t id : ids) want.insert(want.end(), dense.begin() + id * dim, dense.begin() + (id + 1) * dim);
    Expect(dev.Get(out, want.size()), want, 0);
  }
}

void RmsNormCase(Env& env) {
  Device dev(env.be);
  for (int dim : {1, 7, 64, 100, 768}) {
    const int rows = 13;
    const auto x = Random(rows * dim, 5), w = Random(dim, 6);
    std::vector<float> want(x.size());
    ref::RmsNorm(x.data(), w.data(), want.data(), rows, dim, 1e-5f);
    INFO("dim=" << dim);
    float* y = dev.Put(std::vector<float>(x.size()));
    env.be.RmsNorm(dev.Put(x), w.data(), y, rows, dim, 1e-5f);
    Expect(dev.Get(y, x.size()), want, 1e-12);
    float* inplace = dev.Put(x);  // As the final norm runs it.
    env.be.RmsNorm(inplace, w.data(), inplace, rows, dim, 1e-5f);
    Expect(dev.Get(inplace, x.size()), want, 1e-12);
    std::vector<float> shifted = x;  // Rows one float off 16-byte alignment.
    shifted.insert(shifted.begin(), 0.0f);
    float* unaligned = dev.Put(shifted) + 1;
    env.be.RmsNorm(unaligned, w.data(), unaligned, rows, dim, 1e-5f);
    Expect(dev.Get(unaligned, x.size()), want, 1e-12);
  }
}

void RopeCase(Env& env) {
  Device dev(env.be);
  for (int64_t hd : {64, 128, 6}) {
    for (bool llama3 : {false, true}) {
      RopeConfig rc{.head_dim = static_cast<int>(hd), .theta = 500000};
      if (llama3) {
        rc.llama3_factor = 8;
        rc.llama3_original_max_position = 256;
      }
      const std::vector<float> inv = RopeInvFreq(rc);
      const int tokens = 9, heads = 3;
      const std::vector<int32_t> pos = {0, 1, 2, 17, 255, 256, 1000, 4096, 100000};
      const auto x = Random(static_cast<size_t>(tokens * heads * hd), 10);
      std::vector<float> want = x;
      ref::Rope(want.data(), pos.data(), inv.data(), tokens, heads, hd);
      float* got = dev.Put(x);
      env.be.Rope(got, dev.Put(pos), inv.data(), tokens, heads, hd);
      INFO("head_dim=" << hd << " llama3=" << llama3);
      Expect(dev.Get(got, x.size()), want, 1e-12);
    }
  }
}

// A gated activation (SiluMul, GeluTanhMul) against its reference.
void GatedCase(Env& env, void (KernelBackend::*op)(const float*, float*, int64_t, int64_t),
               void (*reference)(const float*, float*, int64_t, int64_t)) {
  Device dev(env.be);
  for (int inter : {1, 7, 100}) {
    const int rows = 13;
    const auto gu = Random(static_cast<size_t>(rows * 2 * inter), 7, 4.0f);
    std::vector<float> want(static_cast<size_t>(rows * inter));
    reference(gu.data(), want.data(), rows, inter);
    float* out = dev.Put(std::vector<float>(want.size()));
    (env.be.*op)(dev.Put(gu), out, rows, inter);
    INFO("inter=" << inter);
    Expect(dev.Get(out, want.size()), want, 1e-12);
  }
}

void ScaleCase(Env& env) {
  Device dev(env.be);
  for (int64_t n : {1, 7, 4097}) {
    const auto x = Random(static_cast<size_t>(n), 26);
    std::vector<float> want = x;
    ref::Scale(want.data(), 33.9411f, n);
    float* got = dev.Put(x);
    env.be.Scale(got, 33.9411f, n);
    INFO("n=" << n);
    Expect(dev.Get(got, want.size()), want, 0);
  }
}

void PagedAttentionCase(Env& env) {
  Device dev(env.be);
  // Head dim 16 in every KV dtype and mode; 64 (two dimensions a lane in
  // the CUDA kernel) in f16; 128 (a real model's, four a lane) in f32 and bf16.
  for (auto [kv_dtype, hd] : std::vector<std::pair<DType, int64_t>>{{DType::kF32, 16},
                                                                    {DType::kBF16, 16},
                                                                    {DType::kF16, 16},
                                                                    {DType::kF16, 64},
                                                                    {DType::kF32, 128},
                                                                    {DType::kBF16, 128}}) {
    if (!env.be.SupportsKv(kv_dtype)) continue;
    const KvLayout l{.num_layers = 2, .num_kv_heads = 2, .block_size = 4, .head_dim = hd, .dtype = kv_dtype};
    const int num_blocks = 80;  // Tables: 6, 4, 8 and 48 blocks from table_at.
    const std::vector<uint8_t> pool = PoolOf(l, Random(num_blocks * l.BlockStride(), 11));
    std::vector<int32_t> tables(num_blocks);
    for (int i = 0; i < num_blocks; ++i) tables[i] = (i * 7) % num_blocks;
    // A chunk after a cached prefix, a fresh prompt, a decode token, and a
    // long chunk (several tiles) after 40 cached positions.
    std::vector<AttentionSeq> seqs = {{.first_row = 0, .num_tokens = 5, .start_pos = 18},
                                      {.first_row = 5, .num_tokens = 13, .start_pos = 0},
                                      {.first_row = 18, .num_tokens = 1, .start_pos = 30},
                                      {.first_row = 19, .num_tokens = 150, .start_pos = 40}};
    const int64_t table_at[] = {0, 6, 10, 20};
    const int32_t* dev_tables = dev.Put(tables);
    std::vector<AttentionSeq> host_seqs = seqs, dev_seqs = seqs;
    for (size_t s = 0; s < seqs.size(); ++s) {
      host_seqs[s].block_table = tables.data() + table_at[s];
      dev_seqs[s].block_table = dev_tables + table_at[s];
    }
    const AttentionSeq* seqs_at = dev.Put(dev_seqs);
    const void* kv = dev.Put(pool);
    const int rows = 169;
    for (auto [nq, head_begin, heads] : std::vector<std::tuple<int, int, int>>{{6, 0, 0}, {3, 1, 1}}) {
      const auto q = Random(static_cast<size_t>(rows * nq * hd), 12);
      for (auto [window, softcap] : std::vector<std::pair<int64_t, float>>{{0, 0.0f}, {5, 0.0f}, {0, 1.5f}}) {
        INFO("KV " << DTypeName(kv_dtype) << " head dim " << hd << " window " << window << " softcap " << softcap
                   << " heads " << head_begin << "+" << heads);
        PagedAttentionArgs args{.layout = l, .layer = 1, .num_q_heads = nq, .scale = 0.25f, .softcap = softcap,
                                .window = window,
                                .num_seqs = static_cast<int64_t>(seqs.size()), .kv_head_begin = head_begin,
                                .kv_heads = heads};
        std::vector<float> want(q.size());
        PagedAttentionArgs host = args;
        host.q = q.data();
        host.out = want.data();
        host.kv = pool.data();
        host.seqs = host_seqs.data();
        ref::PagedAttention(host);
        args.q = dev.Put(q);
        args.out = dev.Put(std::vector<float>(q.size()));
        args.kv = kv;
        args.seqs = seqs_at;
        env.be.PagedAttention(args);
        Expect(dev.Get(args.out, q.size()), want, 1e-10);
      }
    }
  }
}

void KvStoreCase(Env& env) {
  Device dev(env.be);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (!env.be.SupportsKv(dtype)) continue;
    const KvLayout l{.num_layers = 2, .num_kv_heads = 4, .block_size = 4, .head_dim = 8, .dtype = dtype};
    const int64_t blocks = 5, rows = 8;
    // Scattered over blocks 0, 1, 2 and 4; -1 a padding row that stores nothing.
    const std::vector<int32_t> slots = {17, 3, -1, 4, 0, 19, 8, 10};
    const std::vector<uint8_t> pool0 = PoolOf(l, Random(static_cast<size_t>(blocks * l.BlockStride()), 13));
    for (auto [head_begin, heads] : std::vector<std::pair<int, int>>{{0, 4}, {1, 2}}) {
      const auto k = Random(static_cast<size_t>(rows * heads * l.head_dim), 11),
                 v = Random(static_cast<size_t>(rows * heads * l.head_dim), 12);
      std::vector<uint8_t> want = pool0;
      ref::KvStore({.k = k.data(), .v = v.data(), .slots = slots.data(), .rows = rows, .kv = want.data(), .layout = l,
                    .layer = 1, .kv_head_begin = head_begin, .kv_heads = heads});
      uint8_t* kv = dev.Put(pool0);
      const KvStoreArgs args{.k = dev.Put(k), .v = dev.Put(v), .slots = dev.Put(slots), .rows = rows, .kv = kv,
                             .layout = l, .layer = 1, .kv_head_begin = head_begin, .kv_heads = heads};
      env.be.KvStore(args);
      INFO(DTypeName(dtype) << " heads " << head_begin << "+" << heads);
      CHECK(dev.Get(kv, want.size()) == want);
    }
  }
}

void AddCase(Env& env) {
  Device dev(env.be);
  for (int64_t n : {1, 7, 33, 4097, 10000}) {
    const auto x = Random(static_cast<size_t>(n), 21), y = Random(static_cast<size_t>(n), 22);
    std::vector<float> want = y;
    ref::Add(x.data(), want.data(), n);
    float* got = dev.Put(y);
    env.be.Add(dev.Put(x), got, n);
    INFO("n=" << n);
    Expect(dev.Get(got, want.size()), want, 0);
  }
}

void GatherRowsCase(Env& env) {
  Device dev(env.be);
  for (int64_t dim : {1, 37, 512}) {
    const auto x = Random(static_cast<size_t>(9 * dim), 23);
    const std::vector<int32_t> rows = {8, 0, 3, 3};
    std::vector<float> want(rows.size() * dim);
    ref::GatherRows(x.data(), rows.data(), static_cast<int64_t>(rows.size()), dim, want.data());
    float* out = dev.Put(std::vector<float>(want.size(), -1.0f));
    env.be.GatherRows(dev.Put(x), dev.Put(rows), static_cast<int64_t>(rows.size()), dim, out);
    INFO("dim=" << dim);
    Expect(dev.Get(out, want.size()), want, 0);
  }
}

void Copy2DCase(Env& env) {
  Device dev(env.be);
  // A q/k/v split's shape (a column range of wider rows into packed rows)
  // and a logits slice's (packed rows into a column range of wider ones).
  for (auto [rows, cols, src_stride, src_col, dst_stride, dst_col] : std::vector<std::tuple<int, int, int, int, int, int>>{
           {5, 7, 11, 4, 7, 0}, {3, 9, 9, 0, 20, 11}, {1, 1, 1, 0, 1, 0}, {17, 64, 192, 128, 64, 0}}) {
    const auto src = Random(static_cast<size_t>(rows * src_stride), 24),
               dst0 = Random(static_cast<size_t>(rows * dst_stride), 25);
    std::vector<float> want = dst0;
    ref::Copy2D(src.data() + src_col, src_stride, want.data() + dst_col, dst_stride, rows, cols);
    float* dst = dev.Put(dst0);
    env.be.Copy2D(dev.Put(src) + src_col, src_stride, dst + dst_col, dst_stride, rows, cols);
    INFO("rows=" << rows << " cols=" << cols << " strides " << src_stride << ", " << dst_stride);
    Expect(dev.Get(dst, want.size()), want, 0);
  }
}

void MoeCase(Env& env) {
  // Softmax probabilities over the experts are summed into the outputs, so
  // summation alone separates the backends from the reference, as in Gemm.
  constexpr double kTolerance = 1e-11;
  Device dev(env.be);
  const int64_t E = 6, H = 64, I = 96;
  for (DType dtype : kAllDTypes) {
    if (!env.be.Supports(WeightOp::kGemm, dtype)) continue;
    std::vector<HostWeights> weights;
    std::vector<ExpertWeights> experts;
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<float> gu = Random(static_cast<size_t>(2 * I * H), 40 + e, 0.3f),
                               down = Random(static_cast<size_t>(H * I), 50 + e, 0.3f);
      weights.push_back(QuantizeWeights(gu.data(), 2 * I, H, dtype));
      weights.push_back(QuantizeWeights(down.data(), H, I, dtype));
    }
    for (int64_t e = 0; e < E; ++e) experts.push_back({weights[2 * e].view(), weights[2 * e + 1].view()});
    // One row, a decode batch, a prefill's rows (some experts idle at 1, all
    // busy at 33); top 1, 2 (renormalised and not) and all of them.
    for (int64_t rows : {1, 9, 33}) {
      for (auto [top_k, renormalize] : std::vector<std::pair<int64_t, bool>>{{1, false}, {2, false}, {2, true}, {E, true}}) {
        {
          INFO(DTypeName(dtype) << " rows=" << rows << " top_k=" << top_k << " renormalize=" << renormalize);
          const std::vector<float> x = Random(static_cast<size_t>(rows * H), 60),
                                   scores = Random(static_cast<size_t>(rows * E), 61, 3.0f);
          std::vector<float> want(static_cast<size_t>(rows * H));
          MoeArgs args{.num_experts = E, .top_k = top_k, .renormalize = renormalize, .rows = rows};
          args.experts = experts.data();
          MoeArgs host = args;
          host.x = x.data();
          host.scores = scores.data();
          host.out = want.data();
          ref::Moe(host);
          args.x = dev.Put(x);
          args.scores = dev.Put(scores);
          args.out = dev.Put(std::vector<float>(want.size(), -1.0f));
          args.scratch = dev.Put(std::vector<uint8_t>(static_cast<size_t>(MoeScratchBytes(rows, top_k, E, H, I))));
          REQUIRE(env.be.Moe(args).ok());
          Expect(dev.Get(args.out, want.size()), want, kTolerance);
        }
      }
    }
  }
}

// Two ranks on two threads: `be` rank 0 and `peer` rank 1.
void CollectivesCase(Env& env) {
  Device d0(env.be), d1(env.peer);
  for (int64_t n : {1, 7, 1000}) {
    const auto a = Random(static_cast<size_t>(n), 31), b = Random(static_cast<size_t>(n), 32),
               m0 = Random(static_cast<size_t>(n + 1), 33), m1 = Random(static_cast<size_t>(n), 34);
    float* sum[] = {d0.Put(a), d1.Put(b)};
    const float* out[] = {d0.Put(m0), d1.Put(m1)};  // rank 0 sends n + 1 floats, rank 1 n
    float* in[] = {d0.Put(std::vector<float>(static_cast<size_t>(n))),
                   d1.Put(std::vector<float>(static_cast<size_t>(n + 1)))};
    std::vector<CommunicatorPtr> comms = NewThreadCommunicators(2);
    KernelBackend* be[] = {&env.be, &env.peer};
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        be[r]->AllReduceSum(*comms[r], sum[r], n);
        be[r]->Send(*comms[r], 1 - r, out[r], n + 1 - r);
        be[r]->Recv(*comms[r], 1 - r, in[r], n + r);
      });
    }
    for (std::thread& t : ranks) t.join();
    std::vector<float> want(static_cast<size_t>(n));
    for (size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];  // in rank order
    INFO("n=" << n);
    Expect(d0.Get(sum[0], want.size()), want, 0);
    Expect(d1.Get(sum[1], want.size()), want, 0);
    Expect(d0.Get(in[0], m1.size()), m1, 0);
    Expect(d1.Get(in[1], m0.size()), m0, 0);
  }
}

const std::vector<OpCase>& Cases() {
  static const std::vector<OpCase>* cases = new std::vector<OpCase>{
      {{"gemm"}, GemmCase},
      {{"embedding"}, EmbeddingCase},
      {{"rms_norm"}, RmsNormCase},
      {{"rope"}, RopeCase},
      {{"silu_mul"}, [](Env& env) { GatedCase(env, &KernelBackend::SiluMul, ref::SiluMul); }},
      {{"gelu_tanh_mul"}, [](Env& env) { GatedCase(env, &KernelBackend::GeluTanhMul, ref::GeluTanhMul); }},
      {{"scale"}, ScaleCase},
      {{"paged_attention"}, PagedAttentionCase},
      {{"kv_store"}, KvStoreCase},
      {{"add"}, AddCase},
      {{"gather_rows"}, GatherRowsCase},
      {{"copy_2d"}, Copy2DCase},
      {{"moe"}, MoeCase},
      {{"all_reduce_sum", "send", "recv"}, CollectivesCase},
  };
  return *cases;
}

// The CUDA backend: on the SIMT executor's emulated device here (not under
// ASan, which is not told of its fibers' stack switches: tools/test.sh), on
// a GPU in the gpu-tagged twin of this test.
absl::StatusOr<KernelBackendPtr> Cuda(const cuda::CudaBackendOptions& options) {
#if defined(__SANITIZE_ADDRESS__) && defined(DUET_SIMT)
  return absl::UnavailableError("the SIMT executor does not run under ASan");
#else
  return cuda::NewCudaBackend(options);
#endif
}

struct BackendKind {
  std::string name;
  std::function<absl::StatusOr<KernelBackendPtr>()> make;
  // Whether it runs the CPU's SIMD paths, which AVX-512 on and off and the
  // scalar twin (DUET_NO_AVX2) change; the others run once, AVX-512 on.
  bool cpu_simd = true;
};

std::vector<BackendKind> Backends() {
  auto protect = []() -> absl::StatusOr<KernelBackendPtr> {
    absl::StatusOr<KernelBackendPtr> inner = NewBackend({.kind = "cpu", .threads = 2});
    if (!inner.ok()) return inner.status();
    return KernelBackendPtr(std::make_unique<ProtectedBackend>(*std::move(inner)));
  };
  return {
      {"cpu", [] { return NewBackend({.kind = "cpu", .threads = 2}); }},
      {"cpu-fastest", [] { return NewBackend({.kind = "cpu", .threads = 2, .cpu_kernels = CpuKernels::kFastest}); }},
      {"protected", protect},
      {"cuda", [] { return Cuda({.activation_dtype = DType::kF32}); }, false},  // the reference's arithmetic
  };
}

TEST_CASE("every op matches the reference on every backend present, AVX-512 on and off", "[kernels]") {
  const bool avx512 = GENERATE(true, false);
  if (!simd::UseAvx2()) WARN("DUET_NO_AVX2 or this CPU: the scalar paths");
  for (const BackendKind& kind : Backends()) {
    if (!kind.cpu_simd && (!avx512 || !simd::UseAvx2())) continue;
    absl::StatusOr<KernelBackendPtr> be = kind.make(), peer = kind.make();
    if (absl::IsUnimplemented(be.status()) || absl::IsUnavailable(be.status())) {
      WARN(kind.name << " is not here: " << be.status().message());
      continue;
    }
    REQUIRE(be.ok());
    REQUIRE(peer.ok());
    simd::SetAvx512ForTesting(avx512);
    Env env{**be, **peer};
    for (const OpCase& c : Cases()) {
      const bool runs = std::all_of(c.ops.begin(), c.ops.end(), [&](const std::string& op) { return (*be)->Implements(op); });
      if (!runs) continue;
      INFO((*be)->Name() << ", " << c.ops[0] << ", AVX-512 " << (avx512 ? "on" : "off"));
      c.run(env);
    }
    simd::SetAvx512ForTesting(true);
  }
}

// Batch sizes the deterministic mode is held to.
const int kBatches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};

// Whether each row of `got` (rows of `width`) has the bits of the same row
// of `all`; a description of the first that does not, else "".
std::string FirstDifferentRow(const std::vector<float>& got, const std::vector<float>& all, int64_t width) {
  for (size_t r = 0; r * width < got.size(); ++r) {
    if (!testing::SameBits(got.data() + r * width, all.data() + r * width, static_cast<size_t>(width))) {
      return absl::StrCat("row ", r);
    }
  }
  return "";
}

// Each GEMM row in batches of kBatches rows (the first b of 33) against the
// same row of the 33-row call: "" when every dtype's rows kept their bits.
std::string GemmBatchDifference(KernelBackend& be) {
  Device dev(be);
  const int64_t n = 70, k = 250, max_m = 33;
  const std::vector<float> wf = Random(static_cast<size_t>(n * k), 71), a = Random(static_cast<size_t>(max_m * k), 72),
                           bias = Random(n, 73);
  for (DType dtype : kAllDTypes) {
    if (!be.Supports(WeightOp::kGemm, dtype)) continue;
    const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
    std::vector<float> all;
    for (int m : {33, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      const std::vector<float> rows(a.begin(), a.begin() + m * k);
      float* c = dev.Put(std::vector<float>(static_cast<size_t>(m * n)));
      REQUIRE(be.Gemm(dev.Put(rows), hw.view(), bias.data(), c, m, false).ok());
      const std::vector<float> got = dev.Get(c, static_cast<size_t>(m * n));
      if (all.empty()) {
        all = got;
      } else if (std::string d = FirstDifferentRow(got, all, n); !d.empty()) {
        return absl::StrCat(DTypeName(dtype), " GEMM, batch of ", m, ": ", d);
      }
    }
  }
  return "";
}

TEST_CASE("deterministic mode: a row's output has the same bits for every batch size 1..9 and 33", "[kernels]") {
  struct Kind {
    std::string name;
    std::function<absl::StatusOr<KernelBackendPtr>()> make;
  };
  const std::vector<Kind> kinds = {
      {"cpu", [] { return NewBackend({.kind = "cpu", .threads = 2, .deterministic = true}); }},
      {"cpu int8", [] { return NewBackend({.kind = "cpu", .threads = 2, .cpu_kernels = CpuKernels::kInt8Activations,
                                           .deterministic = true}); }},
      {"cuda", [] { return Cuda({.deterministic = true, .activation_dtype = DType::kF32}); }},
      {"cuda bf16", [] { return Cuda({.deterministic = true, .activation_dtype = DType::kBF16}); }},
  };
  for (const Kind& kind : kinds) {
    absl::StatusOr<KernelBackendPtr> made = kind.make();
    if (absl::IsUnavailable(made.status())) {
      WARN(kind.name << " is not here: " << made.status().message());
      continue;
    }
    REQUIRE(made.ok());
    KernelBackend& be = **made;
    INFO(be.Name() << " (" << kind.name << ")");
    CHECK(GemmBatchDifference(be).empty());

    Device dev(be);
    // Attention: 33 sequences, each a decode row (positions 5..69) or, for
    // one, a 33-row prefill chunk after 20 cached positions; batches of the
    // first b decode rows, and the chunk cut into chunks of b rows.
    const KvLayout l{.num_layers = 1, .num_kv_heads = 2, .block_size = 4, .head_dim = 64, .dtype = DType::kBF16};
    const int num_blocks = 64;
    const std::vector<int32_t> table = [&] {
      std::vector<int32_t> t(num_blocks);
      for (int i = 0; i < num_blocks; ++i) t[i] = (i * 13) % num_blocks;
      return t;
    }();
    const void* kv = dev.Put(PoolOf(l, Random(static_cast<size_t>(num_blocks * l.BlockStride()), 74)));
    const int32_t* dev_table = dev.Put(table);
    const int64_t nq = 4, width = nq * l.head_dim;
    const std::vector<float> q = Random(static_cast<size_t>(33 * width), 75);
    auto attend = [&](const std::vector<AttentionSeq>& seqs, int64_t first_q_row) {
      int64_t rows = 0;
      for (const AttentionSeq& s : seqs) rows += s.num_tokens;
      PagedAttentionArgs args{.q = dev.Put(std::vector<float>(q.begin() + first_q_row * width,
                                                              q.begin() + (first_q_row + rows) * width)),
                              .out = dev.Put(std::vector<float>(static_cast<size_t>(rows * width))),
                              .kv = kv, .layout = l, .layer = 0, .num_q_heads = nq, .scale = 0.125f,
                              .seqs = dev.Put(seqs), .num_seqs = static_cast<int64_t>(seqs.size())};
      be.PagedAttention(args);
      return dev.Get(args.out, static_cast<size_t>(rows * width));
    };
    auto decode_batch = [&](int b) {
      std::vector<AttentionSeq> seqs;
      for (int s = 0; s < b; ++s) {
        seqs.push_back({.first_row = s, .num_tokens = 1, .start_pos = 5 + 2 * s, .block_table = dev_table});
      }
      return attend(seqs, 0);
    };
    const std::vector<float> decode_all = decode_batch(33);
    const std::vector<float> prefill_all =
        attend({{.first_row = 0, .num_tokens = 33, .start_pos = 20, .block_table = dev_table}}, 0);
    for (int b : kBatches) {
      INFO("attention, batch of " << b);
      CHECK(FirstDifferentRow(decode_batch(b), decode_all, width).empty());
      for (int first = 0; first < 33; first += b) {
        const int rows = std::min(b, 33 - first);
        const std::vector<float> chunk =
            attend({{.first_row = 0, .num_tokens = rows, .start_pos = 20 + first, .block_table = dev_table}}, first);
        const std::vector<float> want(prefill_all.begin() + first * width,
                                      prefill_all.begin() + (first + rows) * width);
        INFO("prefill rows " << first << ".." << first + rows);
        CHECK(FirstDifferentRow(chunk, want, width).empty());
      }
    }

    // MoE (top 2 of 6, Q8 experts): the first b of 33 rows.
    const int64_t E = 6, H = 64, I = 96;
    std::vector<HostWeights> weights;
    std::vector<ExpertWeights> experts;
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<float> gu = Random(static_cast<size_t>(2 * I * H), 80 + e, 0.3f),
                               down = Random(static_cast<size_t>(H * I), 90 + e, 0.3f);
      weights.push_back(QuantizeWeights(gu.data(), 2 * I, H, DType::kQ8));
      weights.push_back(QuantizeWeights(down.data(), H, I, DType::kQ8));
    }
    for (int64_t e = 0; e < E; ++e) experts.push_back({weights[2 * e].view(), weights[2 * e + 1].view()});
    const std::vector<float> x = Random(static_cast<size_t>(33 * H), 76),
                             scores = Random(static_cast<size_t>(33 * E), 77, 3.0f);
    auto moe = [&](int64_t rows) {
      MoeArgs args{.num_experts = E, .top_k = 2, .renormalize = true, .rows = rows};
      args.experts = experts.data();
      args.x = dev.Put(std::vector<float>(x.begin(), x.begin() + rows * H));
      args.scores = dev.Put(std::vector<float>(scores.begin(), scores.begin() + rows * E));
      args.out = dev.Put(std::vector<float>(static_cast<size_t>(rows * H)));
      args.scratch = dev.Put(std::vector<uint8_t>(static_cast<size_t>(MoeScratchBytes(rows, 2, E, H, I))));
      REQUIRE(be.Moe(args).ok());
      return dev.Get(args.out, static_cast<size_t>(rows * H));
    };
    const std::vector<float> moe_all = moe(33);
    for (int b : kBatches) {
      INFO("MoE, batch of " << b);
      CHECK(FirstDifferentRow(moe(b), moe_all, H).empty());
    }
  }
}

TEST_CASE("BF16 mode: the GEMM is the F32 product of its inputs rounded to BF16, deterministic or not",
          "[kernels]") {
  const auto round = [](std::vector<float> v) {
    for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
    return v;
  };
  for (bool deterministic : {false, true}) {
    absl::StatusOr<KernelBackendPtr> be = Cuda({.deterministic = deterministic, .activation_dtype = DType::kBF16});
    if (absl::IsUnavailable(be.status())) {
      WARN(be.status().message());
      return;
    }
    REQUIRE(be.ok());
    CHECK((*be)->DefaultKvDType() == DType::kBF16);
    Device dev(**be);
    for (DType dtype : kAllDTypes) {
      for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{{1, 70, 37}, {9, 129, 100}, {33, 64, 250}}) {
        INFO(DTypeName(dtype) << " m=" << m << " n=" << n << " k=" << k << " deterministic " << deterministic);
        const std::vector<float> wf = Random(static_cast<size_t>(n) * k, 11),
                                 a = Random(static_cast<size_t>(m) * k, 12);
        const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
        float* c = dev.Put(std::vector<float>(static_cast<size_t>(m * n)));
        REQUIRE((*be)->Gemm(dev.Put(a), hw.view(), nullptr, c, m, false).ok());
        // The reference over the rounded values: F32 weights holding
        // Dequantize's values rounded to BF16.
        const std::vector<float> w16 = round(Dequantize(hw.view())), a16 = round(a);
        const HostWeights hw16 = QuantizeWeights(w16.data(), n, k, DType::kF32);
        std::vector<float> want(static_cast<size_t>(m * n)), exact(want.size());
        ref::Gemm(a16.data(), hw16.view(), want.data(), m, false);
        ref::Gemm(a.data(), hw.view(), exact.data(), m, false);
        const std::vector<float> got = dev.Get(c, want.size());
        Expect(got, want, 1e-11);
        // And not the F32 product (the rounding happened): BF16's 8 bits
        // leave an error near 1e-5 NMSE on these sums.
        CHECK(testing::Nmse(got, exact) > 1e-8);
      }
    }
  }
}

TEST_CASE("without deterministic mode the emulated cuBLAS rounds a row by its batch, as a GPU's does", "[kernels]") {
  absl::StatusOr<KernelBackendPtr> be = Cuda({});
  if (absl::IsUnavailable(be.status())) {
    WARN(be.status().message());
    return;
  }
  REQUIRE(be.ok());
  // The check above can fail: here it does. (On a GPU cuBLAS may or may not
  // round these shapes apart; only the emulation is held to it.)
  if ((*be)->Name() == "cuda-simt") CHECK_FALSE(GemmBatchDifference(**be).empty());
}

TEST_CASE("the harness runs every op of the backend interface, and only through ops on protected memory",
          "[kernels]") {
  ProtectedBackend be(NewCpuBackend(2)), peer(NewCpuBackend(2));
  Env env{be, peer};
  for (const OpCase& c : Cases()) {
    for (const std::string& op : c.ops) CHECK(std::find(std::begin(kOpNames), std::end(kOpNames), op) != std::end(kOpNames));
    c.run(env);
  }
  const std::map<std::string, int64_t> calls = be.calls();
  for (std::string_view name : kOpNames) {
    const std::string op(name);
    INFO(op << " has no case in Cases()");
    CHECK(calls.count(op) == 1);
  }
  CHECK(GuardedMemoryClosed());
}

TEST_CASE("protected memory faults when host code touches it, and not through a buffer's copies", "[kernels]") {
  absl::StatusOr<BufferPtr> b = GuardedMemoryType().Allocate(4096, "probe");
  REQUIRE(b.ok());
  const std::vector<float> in = {1.5f, -2.0f};
  std::vector<float> out(2);
  REQUIRE((*b)->Write(0, in.data(), 8).ok());
  REQUIRE((*b)->Read(0, out.data(), 8).ok());
  CHECK(out == in);
  CHECK(GuardedMemoryClosed());
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    signal(SIGSEGV, SIG_DFL);  // No reports from the child: its death is the answer.
    const volatile float* at = static_cast<const float*>((*b)->base());
    const float touched = *at;  // faults: no op is running
    _exit(touched == 1.5f ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
}

}  // namespace
}  // namespace duet::kernels

// What the CPU backend promises beyond the op harness
// (kernels/backend_ops_test.cc, every op against the reference): both
// kernel mixes on the reference's shapes, attention's tiles and TP head
// slices, batch invariance (a row's bits whatever shares its call), and
// AVX-512 giving AVX2's bits; errors by max|fast - ref| / max|ref|. Run
// twice by Bazel: with AVX-512 or AVX2 (where the CPU has them) and with
// DUET_NO_AVX2=1 for the scalar paths.
#include "kernels/cpu/cpu_backend.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/simd.h"
#include "kernels/rope.h"
#include "kernels/testing/op_testing.h"

namespace duet::kernels {
namespace {

using testing::MaxRelError;
using testing::Nmse;
using testing::PoolOf;
using testing::Random;
using testing::SameBits;

// The F32 weight matrix over w's [n][k] floats.
WeightMatrix F32(const std::vector<float>& w, int64_t n, int64_t k) {
  return {.dtype = DType::kF32, .n = n, .k = k, .values = w.data()};
}

TEST_CASE("Gemm matches the reference for GEMV and GEMM shapes, with bias and accumulate",
          "[kernels]") {
  const CpuKernels kernels = GENERATE(CpuKernels::kBatchInvariant, CpuKernels::kFastest);
  auto be = NewCpuBackend(2, kernels);
  for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {1, 300, 77}, {2, 70, 13}, {5, 129, 64}, {8, 200, 96}, {9, 64, 40},
           {33, 256, 100}, {64, 1000, 32}}) {
    auto a = Random(m * k, 1), w = Random(n * k, 2), bias = Random(n, 3);
    auto c0 = Random(m * n, 4);
    for (bool acc : {false, true}) {
      for (bool with_bias : {false, true}) {
        std::vector<float> got = c0, want = c0;
        REQUIRE(be->Gemm(a.data(), F32(w, n, k), with_bias ? bias.data() : nullptr, got.data(), m, acc).ok());
        ref::Gemm(a.data(), w.data(), want.data(), m, n, k, acc);
        if (with_bias) {
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) want[i * n + j] += bias[j];
        }
        INFO("m=" << m << " n=" << n << " k=" << k << " acc=" << acc << " bias=" << with_bias);
        REQUIRE(MaxRelError(got, want) < 1e-5);
      }
    }
  }
}

TEST_CASE("Llama-3 rope scaling changes only the low frequencies", "[kernels]") {
  RopeConfig plain{.head_dim = 128, .theta = 500000};
  RopeConfig scaled = plain;
  scaled.llama3_factor = 8;
  auto a = RopeInvFreq(plain), b = RopeInvFreq(scaled);
  REQUIRE(a[0] == b[0]);                          // Highest frequency kept.
  REQUIRE(b.back() == Approx(a.back() / 8).epsilon(1e-6));  // Lowest divided by factor.
  REQUIRE(a[0] == 1.0f);
}

TEST_CASE("PagedAttention matches the reference: prefill chunks, decode, GQA, window",
          "[kernels]") {
  const CpuKernels kernels = GENERATE(CpuKernels::kBatchInvariant, CpuKernels::kFastest);
  const DType kv_dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  auto be = NewCpuBackend(2, kernels);
  KvLayout l{.num_layers = 2, .num_kv_heads = 2, .block_size = 4, .head_dim = 16, .dtype = kv_dtype};
  const int num_blocks = 40;
  auto pool = PoolOf(l, Random(num_blocks * l.BlockStride(), 11));
  // Three sequences: a chunk after a cached prefix, a fresh prompt, a decode token.
  std::vector<int32_t> t0 = {7, 3, 9, 1, 0, 12}, t1 = {5, 6, 8, 2}, t2 = {20, 21, 22, 23, 24, 25, 26, 27};
  std::vector<AttentionSeq> seqs = {
      {.first_row = 0, .num_tokens = 5, .start_pos = 18, .block_table = t0.data()},
      {.first_row = 5, .num_tokens = 13, .start_pos = 0, .block_table = t1.data()},
      {.first_row = 18, .num_tokens = 1, .start_pos = 30, .block_table = t2.data()},
  };
  const int rows = 19, nq = 6;
  auto q = Random(rows * nq * 16, 12);
  for (int64_t window : {0, 5}) {
    std::vector<float> got(rows * nq * 16), want(rows * nq * 16);
    PagedAttentionArgs args{.q = q.data(), .out = got.data(), .kv = pool.data(), .layout = l,
                            .layer = 1, .num_q_heads = nq, .scale = 0.25f, .window = window,
                            .seqs = seqs.data(), .num_seqs = 3};
    be->PagedAttention(args);
    args.out = want.data();
    ref::PagedAttention(args);
    INFO("window " << window << ", KV " << DTypeName(kv_dtype));
    REQUIRE(MaxRelError(got, want) < 1e-5);
    // A tensor-parallel rank's call: KV head h of the pool alone, with its
    // group's query heads, gives those heads' rows of the whole call (bit
    // for bit where the kernels are batch-invariant), here and in the
    // reference.
    const int group = nq / 2;
    for (int64_t h = 0; h < 2; ++h) {
      INFO("KV head " << h);
      std::vector<float> qh(rows * group * 16), oh(rows * group * 16), rh(rows * group * 16), whole(rows * group * 16),
          whole_ref(rows * group * 16);
      for (int r = 0; r < rows; ++r) {
        for (int g = 0; g < group; ++g) {
          const int64_t from = (r * nq + h * group + g) * 16, to = (r * group + g) * 16;
          std::copy(q.begin() + from, q.begin() + from + 16, qh.begin() + to);
          std::copy(got.begin() + from, got.begin() + from + 16, whole.begin() + to);
          std::copy(want.begin() + from, want.begin() + from + 16, whole_ref.begin() + to);
        }
      }
      PagedAttentionArgs part = args;
      part.q = qh.data();
      part.out = oh.data();
      part.num_q_heads = group;
      part.kv_head_begin = h;
      part.kv_heads = 1;
      be->PagedAttention(part);
      part.out = rh.data();
      ref::PagedAttention(part);
      REQUIRE(rh == whole_ref);
      if (kernels == CpuKernels::kBatchInvariant) {
        REQUIRE(oh == whole);
      } else {
        REQUIRE(MaxRelError(oh, whole) < 1e-6);
      }
    }
  }
}

TEST_CASE("PagedAttention tiles long chunks: several tiles, cached prefix, window", "[kernels]") {
  const CpuKernels kernels = GENERATE(CpuKernels::kBatchInvariant, CpuKernels::kFastest);
  const DType kv_dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  auto be = NewCpuBackend(2, kernels);
  KvLayout l{.num_layers = 1, .num_kv_heads = 2, .block_size = 16, .head_dim = 32, .dtype = kv_dtype};
  const int num_blocks = 24;
  auto pool = PoolOf(l, Random(num_blocks * l.BlockStride(), 21));
  std::vector<int32_t> table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) table[i] = (i * 7) % num_blocks;  // Scattered blocks.
  // 300 query rows after 40 cached positions: tiles of 128, 128 and 44 rows.
  std::vector<AttentionSeq> seqs = {{.first_row = 0, .num_tokens = 300, .start_pos = 40,
                                     .block_table = table.data()}};
  const int nq = 4;
  auto q = Random(300 * nq * 32, 22);
  for (int64_t window : {0, 100}) {
    std::vector<float> got(300 * nq * 32), want(300 * nq * 32);
    PagedAttentionArgs args{.q = q.data(), .out = got.data(), .kv = pool.data(), .layout = l,
                            .layer = 0, .num_q_heads = nq, .scale = 0.17f, .window = window,
                            .seqs = seqs.data(), .num_seqs = 1};
    be->PagedAttention(args);
    args.out = want.data();
    ref::PagedAttention(args);
    INFO("window " << window << ", KV " << DTypeName(kv_dtype));
    REQUIRE(MaxRelError(got, want) < 1e-5);
  }
}

TEST_CASE("batch-invariant Gemm: a row's output has the same bits whatever rows share the call", "[kernels]") {
  auto be = NewCpuBackend(2);
  for (int k : {128, 67, 7}) {  // 16-wide steps only; an 8-wide step and a tail; a tail only.
    const int m = 40, n = 70;
    auto a = Random(m * k, 31), w = Random(n * k, 32), bias = Random(n, 33), c0 = Random(m * n, 34);
    for (bool acc : {false, true}) {
      std::vector<float> all = c0;
      REQUIRE(be->Gemm(a.data(), F32(w, n, k), bias.data(), all.data(), m, acc).ok());
      // The same rows in calls of 1, 2, 3, 8 and 9 rows, starting anywhere.
      for (auto [first, rows] : std::vector<std::pair<int, int>>{{0, 1}, {39, 1}, {17, 2}, {5, 3}, {10, 8}, {30, 9}}) {
        std::vector<float> part(c0.begin() + first * n, c0.begin() + (first + rows) * n);
        REQUIRE(be->Gemm(a.data() + first * k, F32(w, n, k), bias.data(), part.data(), rows, acc).ok());
        INFO("k=" << k << " acc=" << acc << " rows " << first << ".." << first + rows);
        CHECK(SameBits(part.data(), all.data() + first * n, part.size()));
      }
    }
  }
}

TEST_CASE("batch-invariant PagedAttention: a query row's output has the same bits however its sequence is chunked "
          "and whatever else the call holds",
          "[kernels]") {
  const DType kv_dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  // Every width takes AxpyRows' register tiles (AVX2 in 64-column slices); a
  // window cuts each row's keys.
  const int64_t hd = GENERATE(32, 64, 96, 128);
  const int window = GENERATE(0, 50);
  INFO("head_dim " << hd << ", window " << window);
  auto be = NewCpuBackend(2);
  KvLayout l{.num_layers = 1, .num_kv_heads = 2, .block_size = 16, .head_dim = hd, .dtype = kv_dtype};
  const int num_blocks = 24;
  auto pool = PoolOf(l, Random(num_blocks * l.BlockStride(), 41));
  std::vector<int32_t> table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) table[i] = (i * 5) % num_blocks;
  const int64_t nq = 4, width = nq * hd, total = 300;
  auto q = Random(total * width, 42);
  auto run = [&](std::vector<AttentionSeq> seqs, const float* qs, int rows) {
    std::vector<float> out(rows * width);
    PagedAttentionArgs args{.q = qs, .out = out.data(), .kv = pool.data(), .layout = l, .layer = 0,
                            .num_q_heads = nq, .scale = 0.17f, .window = window, .seqs = seqs.data(),
                            .num_seqs = static_cast<int64_t>(seqs.size())};
    be->PagedAttention(args);
    return out;
  };
  // 300 rows after 40 cached positions, in one call.
  const auto all = run({{.first_row = 0, .num_tokens = total, .start_pos = 40, .block_table = table.data()}},
                       q.data(), total);
  // Chunked 130 + 170; one decode-like row; and a chunk batched behind another sequence.
  const auto head = run({{.first_row = 0, .num_tokens = 130, .start_pos = 40, .block_table = table.data()}},
                        q.data(), 130);
  CHECK(SameBits(head.data(), all.data(), head.size()));
  const auto tail = run({{.first_row = 0, .num_tokens = 170, .start_pos = 170, .block_table = table.data()}},
                        q.data() + 130 * width, 170);
  CHECK(SameBits(tail.data(), all.data() + 130 * width, tail.size()));
  const auto one = run({{.first_row = 0, .num_tokens = 1, .start_pos = 339, .block_table = table.data()}},
                       q.data() + 299 * width, 1);
  CHECK(SameBits(one.data(), all.data() + 299 * width, width));
  std::vector<float> mixed_q(q.begin(), q.begin() + 3 * width);                     // Another sequence's 3 rows,
  mixed_q.insert(mixed_q.end(), q.begin() + 200 * width, q.begin() + 220 * width);  // then rows 200..219.
  const auto mixed = run({{.first_row = 0, .num_tokens = 3, .start_pos = 5, .block_table = table.data() + 3},
                          {.first_row = 3, .num_tokens = 20, .start_pos = 240, .block_table = table.data()}},
                         mixed_q.data(), 23);
  CHECK(SameBits(mixed.data() + 3 * width, all.data() + 200 * width, 20 * width));
  // The AVX2 paths (8-lane register tiles) give the AVX-512 tiles' bits.
  simd::SetAvx512ForTesting(false);
  const auto avx2 = run({{.first_row = 0, .num_tokens = total, .start_pos = 40, .block_table = table.data()}},
                        q.data(), total);
  simd::SetAvx512ForTesting(true);
  CHECK(SameBits(avx2.data(), all.data(), all.size()));
  // A half-precision pool gives the bits of an f32 pool holding its values.
  if (kv_dtype != DType::kF32) {
    KvLayout wide = l;
    wide.dtype = DType::kF32;
    std::vector<float> widened(static_cast<size_t>(num_blocks * l.BlockStride()));
    for (size_t i = 0; i < widened.size(); ++i) widened[i] = l.Value(pool.data(), static_cast<int64_t>(i));
    std::vector<float> out(total * width);
    const AttentionSeq seq{.first_row = 0, .num_tokens = total, .start_pos = 40, .block_table = table.data()};
    PagedAttentionArgs args{.q = q.data(), .out = out.data(), .kv = widened.data(), .layout = wide, .layer = 0,
                            .num_q_heads = nq, .scale = 0.17f, .window = window, .seqs = &seq, .num_seqs = 1};
    be->PagedAttention(args);
    CHECK(SameBits(out.data(), all.data(), out.size()));
  }
}


// Where KvStore puts each element, computed apart from the reference (the
// op harness compares the backends with the reference itself).
TEST_CASE("KvStore puts each row's K and V of each head at its slot in every KV dtype, a TP rank's heads only",
          "[kernels]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  auto be = NewCpuBackend(2);
  const KvLayout l{.num_layers = 2, .num_kv_heads = 4, .block_size = 4, .head_dim = 8, .dtype = dtype};
  const int64_t blocks = 5, rows = 7, heads = 2, head_begin = 1;  // a rank holding heads 1 and 2
  const auto k = Random(rows * heads * l.head_dim, 11), v = Random(rows * heads * l.head_dim, 12);
  const std::vector<int32_t> slots = {17, 3, 4, 0, 19, 8, 10};  // scattered over blocks 0, 1, 2, 4
  std::vector<uint8_t> pool(static_cast<size_t>(blocks * l.BlockBytes()));
  be->KvStore({.k = k.data(), .v = v.data(), .slots = slots.data(), .rows = rows, .kv = pool.data(), .layout = l,
               .layer = 1, .kv_head_begin = head_begin, .kv_heads = heads});
  // What the pool holds, element by element, against where each input went.
  std::vector<float> want(static_cast<size_t>(blocks * l.BlockStride()), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        const int64_t at = l.Offset(slots[r] / l.block_size, 1, kv, head_begin + h, slots[r] % l.block_size);
        for (int64_t d = 0; d < l.head_dim; ++d) {
          want[static_cast<size_t>(at + d)] = (kv == 0 ? k : v)[static_cast<size_t>((r * heads + h) * l.head_dim + d)];
        }
      }
    }
  }
  const double tolerance = dtype == DType::kF32 ? 0 : dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  for (size_t i = 0; i < want.size(); ++i) {
    const float got = l.Value(pool.data(), static_cast<int64_t>(i));
    INFO("element " << i);
    REQUIRE(std::fabs(got - want[i]) <= tolerance * std::fabs(want[i]) + (dtype == DType::kF16 ? 6e-8 : 0));  // f16 subnormals
  }
}

// The op harness for weights in every dtype: Gemm against the reference on
// the same dequantized weights, on odd shapes (k off the block, m = 1..9
// and 33), each row's output the same bits for every m, and the same bits
// as the F32 Gemm over the dequantized matrix.
TEST_CASE("Gemm on every weight dtype matches the reference, and a row's bits never depend on m", "[kernels]") {
  const CpuKernels kernels = GENERATE(CpuKernels::kBatchInvariant, CpuKernels::kFastest);
  auto be = NewCpuBackend(2, kernels);
  // NMSE bound per dtype against the reference on the dequantized weights:
  // the kernels multiply by exactly those values, so only float summation
  // differs (the F32 path meets the same bound).
  const double kTolerance = 1e-11;
  for (DType dtype : kAllDTypes) {
    REQUIRE(be->Supports(WeightOp::kGemm, dtype));
    // k = 1037: 33 rows take the L2-blocked GEMM, fewer the streaming one.
    for (auto [n, k] :
         std::vector<std::pair<int, int>>{{1, 1}, {70, 37}, {33, 64}, {129, 100}, {64, 250}, {16, 512}, {11, 1037}}) {
      const std::vector<float> wf = Random(static_cast<size_t>(n) * k, 11);
      const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
      const WeightMatrix w = hw.view();
      const std::vector<float> dense = Dequantize(w);
      const int max_m = 33;
      const std::vector<float> a = Random(static_cast<size_t>(max_m) * k, 12), bias = Random(n, 13);
      std::vector<float> all(static_cast<size_t>(max_m) * n);
      REQUIRE(be->Gemm(a.data(), w, bias.data(), all.data(), max_m, false).ok());
      INFO(DTypeName(dtype) << " n=" << n << " k=" << k);
      std::vector<float> want(all.size());
      ref::Gemm(a.data(), w, want.data(), max_m, false);
      for (int i = 0; i < max_m; ++i)
        for (int j = 0; j < n; ++j) want[i * n + j] += bias[j];
      CHECK(Nmse(all, want) < kTolerance);
      if (kernels == CpuKernels::kBatchInvariant) {
        std::vector<float> f32(all.size());
        REQUIRE(be->Gemm(a.data(), F32(dense, n, k), bias.data(), f32.data(), max_m, false).ok());
        CHECK(SameBits(all.data(), f32.data(), all.size()));
      }
      // kFastest's F32 GEMM is OpenBLAS's above a few rows, which rounds
      // by the row count; every other dtype takes the dot tiles in both mixes.
      const bool invariant = kernels == CpuKernels::kBatchInvariant || dtype != DType::kF32;
      for (int m = 1; m <= 9; ++m) {
        std::vector<float> got(static_cast<size_t>(m) * n, 7.0f), acc = got;
        REQUIRE(be->Gemm(a.data(), w, bias.data(), got.data(), m, false).ok());
        INFO("m=" << m);
        if (invariant) CHECK(SameBits(got.data(), all.data(), got.size()));
        // accumulate adds to what c holds.
        REQUIRE(be->Gemm(a.data(), w, nullptr, acc.data(), m, true).ok());
        std::vector<float> acc_want(got.size(), 7.0f);
        ref::Gemm(a.data(), w, acc_want.data(), m, true);
        CHECK(Nmse(acc, acc_want) < kTolerance);
      }
    }
  }
}

// The AVX-512 paths keep the AVX2 paths' lanes and order: the same bits on
// every dtype and row count, so machines with and without AVX-512 serve the
// same tokens. (Where the CPU lacks AVX-512 both runs take the AVX2 path.)
TEST_CASE("AVX-512 and AVX2 give the same bits on every dtype, row count and dot", "[kernels]") {
  if (!simd::UseAvx512()) WARN("this CPU has no AVX-512: both runs take the AVX2 paths");
  auto be = NewCpuBackend(2);
  auto run = [&](bool avx512, const std::function<void()>& fn) {
    simd::SetAvx512ForTesting(avx512);
    fn();
    simd::SetAvx512ForTesting(true);
  };
  for (DType dtype : kAllDTypes) {
    for (auto [n, k] : std::vector<std::pair<int, int>>{{70, 37}, {129, 100}, {64, 250}, {16, 512}, {9, 7}, {11, 1037}}) {
      const std::vector<float> wf = Random(static_cast<size_t>(n) * k, 41);
      const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
      for (int m : {1, 2, 3, 4, 5, 9, 33}) {
        const std::vector<float> a = Random(static_cast<size_t>(m) * k, 42);
        std::vector<float> wide(static_cast<size_t>(m) * n), narrow(wide.size());
        run(true, [&] { REQUIRE(be->Gemm(a.data(), hw.view(), nullptr, wide.data(), m, false).ok()); });
        run(false, [&] { REQUIRE(be->Gemm(a.data(), hw.view(), nullptr, narrow.data(), m, false).ok()); });
        INFO(DTypeName(dtype) << " n=" << n << " k=" << k << " m=" << m);
        CHECK(SameBits(wide.data(), narrow.data(), wide.size()));
      }
    }
  }
  for (int n : {1, 7, 16, 37, 64, 100, 250}) {
    const std::vector<float> x = Random(n, 43), y = Random(n, 44);
    float wide = 0, narrow = 0;
    run(true, [&] { wide = simd::Dot(x.data(), y.data(), n); });
    run(false, [&] { narrow = simd::Dot(x.data(), y.data(), n); });
    INFO("dot n=" << n);
    CHECK(SameBits(&wide, &narrow, 1));
  }
}

// kInt8Activations as simd.h defines it, computed here from the
// definition: each row's blocks of 32 quantized to int8, each block's
// integer dot in 8 lanes of four products, one fused multiply-add per lane
// and block, the lanes summed in Dot's order.
std::vector<float> Int8Definition(const std::vector<float>& a, int64_t m, const WeightMatrix& w) {
  const int64_t k = w.k, blocks = QuantBlocks(k);
  std::vector<int> wi(static_cast<size_t>(w.n * blocks * kQuantBlock));
  const std::vector<float> dense = Dequantize(w);
  for (int64_t j = 0; j < w.n; ++j) {
    for (int64_t e = 0; e < k; ++e) {
      // Dequantize gives (q - zero) x scale exactly (at most 19 bits).
      const float s = w.scales[j * blocks + e / kQuantBlock];
      wi[j * blocks * kQuantBlock + e] = s == 0 ? 0 : static_cast<int>(std::lround(dense[j * k + e] / s));
    }
  }
  std::vector<float> out(static_cast<size_t>(m * w.n));
  for (int64_t i = 0; i < m; ++i) {
    std::vector<int> q(static_cast<size_t>(blocks * kQuantBlock), 0);
    std::vector<float> d(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0;
      for (int64_t e = b * kQuantBlock; e < std::min(k, (b + 1) * kQuantBlock); ++e) {
        amax = std::max(amax, std::fabs(a[i * k + e]));
      }
      d[b] = amax / 127.0f;
      const float inv = d[b] == 0 ? 0 : 1.0f / d[b];
      for (int64_t e = b * kQuantBlock; e < std::min(k, (b + 1) * kQuantBlock); ++e) {
        q[e] = static_cast<int>(std::nearbyint(a[i * k + e] * inv));
      }
    }
    for (int64_t j = 0; j < w.n; ++j) {
      float lane[8] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const float scale = d[b] * w.scales[j * blocks + b];
        for (int l = 0; l < 8; ++l) {
          int p = 0;
          for (int64_t e = b * kQuantBlock + 4 * l; e < b * kQuantBlock + 4 * l + 4; ++e) {
            p += q[e] * wi[j * blocks * kQuantBlock + e];
          }
          lane[l] = std::fma(static_cast<float>(p), scale, lane[l]);
        }
      }
      out[i * w.n + j] = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    }
  }
  return out;
}

TEST_CASE("int8 activations: the defined integer dots, a row's bits whatever m, AVX-512 giving AVX2's bits, "
          "near the exact product",
          "[kernels]") {
  auto be = NewCpuBackend(2, CpuKernels::kInt8Activations);
  auto exact = NewCpuBackend(2);
  for (DType dtype : kAllDTypes) {
    for (auto [n, k] : std::vector<std::pair<int, int>>{{70, 37}, {129, 100}, {64, 250}, {16, 512}, {9, 7}}) {
      const std::vector<float> wf = Random(static_cast<size_t>(n) * k, 51);
      const HostWeights hw = QuantizeWeights(wf.data(), n, k, dtype);
      const WeightMatrix w = hw.view();
      const int max_m = 33;
      const std::vector<float> a = Random(static_cast<size_t>(max_m) * k, 52);
      std::vector<float> all(static_cast<size_t>(max_m) * n), ex(all.size());
      REQUIRE(be->Gemm(a.data(), w, nullptr, all.data(), max_m, false).ok());
      REQUIRE(exact->Gemm(a.data(), w, nullptr, ex.data(), max_m, false).ok());
      INFO(DTypeName(dtype) << " n=" << n << " k=" << k);
      if (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) {
        // Float weights keep the exact kernels.
        CHECK(SameBits(all.data(), ex.data(), all.size()));
        continue;
      }
      const std::vector<float> want = Int8Definition(a, max_m, w);
      CHECK(SameBits(all.data(), want.data(), all.size()));
      // Activation rounding (half a step of max|x| / 127 per block): near
      // the exact product, and not it.
      const double nmse = Nmse(all, ex);
      CHECK(nmse < 1e-4);
      CHECK(nmse > 0);
      for (int m = 1; m <= 9; ++m) {
        std::vector<float> got(static_cast<size_t>(m) * n), acc(got.size(), 3.0f);
        REQUIRE(be->Gemm(a.data(), w, nullptr, got.data(), m, false).ok());
        INFO("m=" << m);
        CHECK(SameBits(got.data(), all.data(), got.size()));
        REQUIRE(be->Gemm(a.data(), w, nullptr, acc.data(), m, true).ok());
        for (size_t t = 0; t < acc.size(); ++t) CHECK(acc[t] == 3.0f + got[t]);
      }
      std::vector<float> narrow(all.size());
      simd::SetAvx512ForTesting(false);
      REQUIRE(be->Gemm(a.data(), w, nullptr, narrow.data(), max_m, false).ok());
      simd::SetAvx512ForTesting(true);
      CHECK(SameBits(narrow.data(), all.data(), all.size()));
    }
  }
}

}  // namespace
}  // namespace duet::kernels

#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/simd.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace duet::kernels {
namespace {

class CpuBackend final : public KernelBackend {
 public:
  CpuBackend(int threads, CpuKernels kernels)
      : invariant_(kernels != CpuKernels::kFastest), int8_(kernels == CpuKernels::kInt8Activations), pool_(threads) {
    openblas_set_num_threads(1);
  }

  std::string Name() const override { return int8_ ? "cpu-int8" : invariant_ ? "cpu" : "cpu-fastest"; }
  BufferType& DefaultBufferType() override { return HostMemoryType(); }

  // Up to this many rows Gemm dots weight rows itself instead of calling
  // OpenBLAS's GEMM. Measured on the bench model by duet profile, one
  // thread: a decode step of 2 sequences took 2.4x one with GEMM and 1.4x
  // with the dots; the two cost the same near 10 rows.
  static constexpr int64_t kFewRows = 8;

  // Runs slice(n0, n1) on the pool for column slices of at least 64 of
  // `n` outputs (so each single-threaded OpenBLAS call is big enough to run
  // at its full rate), then adds the bias to c's [m][n] slice.
  template <typename Slice>
  void ColumnSlices(int64_t m, int64_t n, const float* bias, float* c, Slice slice) {
    const auto [slices, per] = Slices(n);
    pool_.ParallelFor(slices, [&](int64_t sb, int64_t se) {
      for (int64_t s = sb; s < se; ++s) {
        const int64_t n0 = s * per;
        const int64_t n1 = std::min(n, n0 + per);
        if (n0 >= n1) continue;
        slice(n0, n1);
        if (bias != nullptr) {
          for (int64_t i = 0; i < m; ++i) simd::Add(bias + n0, c + i * n + n0, n1 - n0);
        }
      }
    });
  }

  // Columns [n0, n1) of a * w^T into c[i * ldc + (j - n0)] (+= where
  // accumulate): the F32 kernels for w of floats, simd::DotRowsW for every
  // other dtype (in either kernel mix).
  void DotColumns(const float* a, int64_t m, const WeightMatrix& w, int64_t n0, int64_t n1, float* c, int64_t ldc,
                  bool accumulate) {
    if (w.dtype != DType::kF32) {
      if (int8_) return simd::DotRowsInt8(a, m, w, n0, n1, c, ldc, accumulate);
      return simd::DotRowsW(a, m, w, n0, n1, c, ldc, accumulate);
    }
    const int64_t k = w.k;
    const float* wf = static_cast<const float*>(w.values) + n0 * k;
    const float beta = accumulate ? 1.0f : 0.0f;
    if (invariant_) {
      simd::DotRows(a, m, wf, n1 - n0, k, c, ldc, accumulate);
    } else if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n1 - n0, k, 1.0f, wf, k, a, 1, beta, c, 1);
    } else if (m <= kFewRows) {
      // A decode step's few rows: each weight row is read from memory
      // once and dotted with every activation row while it sits in L1.
      // OpenBLAS's GEMM first packs the whole weight slice, which at
      // this m costs more than the product itself.
      for (int64_t j = 0; j < n1 - n0; ++j) {
        const float* wj = wf + j * k;
        for (int64_t i = 0; i < m; ++i) {
          const float d = simd::Dot(a + i * k, wj, k);
          float& out = c[i * ldc + j];
          out = accumulate ? out + d : d;
        }
      }
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, k, 1.0f, a, k, wf, k, beta, c, ldc);
    }
  }

  // The column slices ColumnSlices cuts `n` outputs into: how many, and
  // the width of each but the last.
  std::pair<int64_t, int64_t> Slices(int64_t n) const {
    const int64_t slices = std::min<int64_t>(pool_.num_threads(), std::max<int64_t>(1, n / 64));
    return {slices, ((n + slices - 1) / slices + 15) / 16 * 16};
  }

  bool Supports(WeightOp, DType) const override { return true; }
  // f32 by default: the pool then holds exactly what was computed.
  DType DefaultKvDType() const override { return DType::kF32; }
  bool SupportsKv(DType dtype) const override { return IsKvDType(dtype); }

  absl::Status Gemm(const float* a, const WeightMatrix& w, const float* bias, float* c, int64_t m,
                    bool accumulate) override {
    ColumnSlices(m, w.n, bias, c,
                 [&](int64_t n0, int64_t n1) { DotColumns(a, m, w, n0, n1, c + n0, w.n, accumulate); });
    return absl::OkStatus();
  }

  // The rows grouped by expert in the scratch (a counting sort of the
  // (row, choice) pairs), then each active expert's gate/up product over
  // its rows, the activations, its down product, all experts' column
  // slices in one parallel pass each; then each row's weighted sum of its
  // experts' outputs in RouteRow's order. Each row's products are
  // DotColumns's, so the batch-invariant kernels give a row the same bits
  // whatever the other rows chose.
  absl::Status Moe(const MoeArgs& a) override {
    const int64_t H = a.hidden(), I = a.inter(), E = a.num_experts, K = a.top_k, P = a.rows * K;
    const MoeScratch s = MoeScratchFor(a.rows, K, E, H, I);
    uint8_t* const sb = static_cast<uint8_t*>(a.scratch);
    int32_t* expert = reinterpret_cast<int32_t*>(sb + s.expert);
    float* weight = reinterpret_cast<float*>(sb + s.weight);
    int32_t* slot = reinterpret_cast<int32_t*>(sb + s.slot);
    int32_t* first = reinterpret_cast<int32_t*>(sb + s.first);
    float *xs = reinterpret_cast<float*>(sb + s.xs), *gu = reinterpret_cast<float*>(sb + s.gu),
          *act = reinterpret_cast<float*>(sb + s.act), *ys = reinterpret_cast<float*>(sb + s.ys);
    for (int64_t r = 0; r < a.rows; ++r) {
      RouteRow(a.scores + r * E, E, K, a.renormalize, expert + r * K, weight + r * K);
    }
    std::fill(first, first + E + 1, 0);
    for (int64_t p = 0; p < P; ++p) ++first[expert[p] + 1];
    for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
    std::vector<int32_t> next(first, first + E);
    for (int64_t p = 0; p < P; ++p) {
      slot[p] = next[expert[p]]++;
      std::memcpy(xs + slot[p] * H, a.x + (p / K) * H, static_cast<size_t>(H) * sizeof(float));
    }
    // One pass over every active expert's column slices of a product.
    struct Item {
      int32_t e;
      int64_t n0, n1;
    };
    const auto run = [&](int64_t n, auto product) {
      std::vector<Item> items;
      const auto [slices, per] = Slices(n);
      for (int32_t e = 0; e < E; ++e) {
        if (first[e + 1] == first[e]) continue;
        for (int64_t n0 = 0; n0 < n; n0 += per) items.push_back({e, n0, std::min(n, n0 + per)});
      }
      pool_.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t end) {
        for (int64_t i = b; i < end; ++i) product(items[i]);
      });
    };
    run(2 * I, [&](const Item& it) {
      DotColumns(xs + first[it.e] * H, first[it.e + 1] - first[it.e], a.experts[it.e].gate_up, it.n0, it.n1,
                 gu + first[it.e] * 2 * I + it.n0, 2 * I, false);
    });
    SiluMul(gu, act, P, I);
    run(H, [&](const Item& it) {
      DotColumns(act + first[it.e] * I, first[it.e + 1] - first[it.e], a.experts[it.e].down, it.n0, it.n1,
                 ys + first[it.e] * H + it.n0, H, false);
    });
    pool_.ParallelFor(a.rows, [&](int64_t b, int64_t end) {
      for (int64_t r = b; r < end; ++r) {
        float* o = a.out + r * H;
        std::fill(o, o + H, 0.0f);
        for (int64_t j = 0; j < K; ++j) simd::Axpy(weight[r * K + j], ys + slot[r * K + j] * H, o, H);
      }
    }, 4);
    return absl::OkStatus();
  }

  absl::Status EmbeddingLookup(const WeightMatrix& table, const int32_t* ids, float* out,
                               int64_t num_tokens) override {
    for (int64_t t = 0; t < num_tokens; ++t) DequantizeRow(table, ids[t], out + t * table.k);
    return absl::OkStatus();
  }

  void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
               float eps) override {
    pool_.ParallelFor(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        float ss = simd::SumSquares(x + r * dim, dim);
        float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
        simd::ScaleMul(x + r * dim, inv, w, y + r * dim, dim);
      }
    }, 8);
  }

  void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
            int64_t num_heads, int64_t head_dim) override {
    const int64_t half = head_dim / 2;
    pool_.ParallelFor(num_tokens, [&](int64_t b, int64_t e) {
      std::vector<float> cs(half), sn(half);
      for (int64_t t = b; t < e; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          float angle = static_cast<float>(positions[t]) * inv_freq[i];
          cs[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
          sn[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
        }
        for (int64_t h = 0; h < num_heads; ++h) {
          float* v = x + (t * num_heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * cs[i] - x2 * sn[i];
            v[i + half] = x2 * cs[i] + x1 * sn[i];
          }
        }
      }
    }, 4);
  }

  void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    pool_.ParallelFor(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        simd::SiluMul(gu + r * 2 * inter, gu + r * 2 * inter + inter, out + r * inter, inter);
      }
    }, 4);
  }

  void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) override {
    pool_.ParallelFor(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        simd::GeluTanhMul(gu + r * 2 * inter, gu + r * 2 * inter + inter, out + r * inter, inter);
      }
    }, 4);
  }

  void Scale(float* x, float s, int64_t n) override {
    pool_.ParallelFor(n, [&](int64_t b, int64_t e) { simd::Scale(x + b, s, e - b); }, 4096);
  }

  // A copy with a rounding per element (KvLayout::Store): the reference's loop is the op.
  void KvStore(const KvStoreArgs& a) override { ref::KvStore(a); }

  void Add(const float* x, float* y, int64_t n) override {
    pool_.ParallelFor(n, [&](int64_t b, int64_t e) { simd::Add(x + b, y + b, e - b); }, 4096);
  }

  void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) override {
    for (int64_t i = 0; i < num_rows; ++i) {
      std::memcpy(out + i * dim, x + static_cast<int64_t>(rows[i]) * dim, static_cast<size_t>(dim) * sizeof(float));
    }
  }

  void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
              int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(cols) * sizeof(float));
    }
  }

  // Host memory: the communicator's own copies are the collectives.
  void AllReduceSum(Communicator& comm, float* data, int64_t n) override { comm.AllReduceSum(data, n); }
  void Send(Communicator& comm, int peer, const float* data, int64_t n) override { comm.Send(peer, data, n); }
  void Recv(Communicator& comm, int peer, float* data, int64_t n) override { comm.Recv(peer, data, n); }

  void PagedAttention(const PagedAttentionArgs& a) override {
    const int64_t nkv = a.KvHeads();
    // Work items: a tile of query rows of one sequence against one KV head.
    // Tiles run as AttentionTile (all the group's query heads share the
    // gathered K and V, and each output row stays in registers across the
    // keys), decode rows too with the batch-invariant kernels, whose tiles
    // give a row AttentionRow's bits; the fastest kernels' short runs take
    // the row path, which reads each K/V row once per query head.
    struct Item {
      int32_t seq;
      int32_t first;  // Offset of the tile's first row inside the sequence.
      int32_t rows;
      int32_t kvh;
    };
    std::vector<Item> items;
    for (int64_t s = 0; s < a.num_seqs; ++s) {
      const int64_t n = a.seqs[s].num_tokens;
      const int64_t tile = n < kGemmMinRows ? 1 : invariant_ ? kInvariantTileRows : kTileRows;
      for (int64_t first = 0; first < n; first += tile) {
        for (int64_t h = 0; h < nkv; ++h) {
          items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(first),
                           static_cast<int32_t>(std::min(tile, n - first)), static_cast<int32_t>(h)});
        }
      }
    }
    pool_.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
      std::vector<float> scratch;
      for (int64_t it = b; it < e; ++it) {
        const Item& item = items[it];
        if (item.rows >= kGemmMinRows || invariant_) {
          AttentionTile(a, a.seqs[item.seq], item.first, item.rows, item.kvh, invariant_, scratch);
        } else {
          for (int32_t r = 0; r < item.rows; ++r) {
            AttentionRow(a, a.seqs[item.seq], item.first + r, item.kvh, scratch);
          }
        }
      }
    });
  }

 private:
  static constexpr int64_t kGemmMinRows = 8;
  static constexpr int64_t kTileRows = 128;
  // Batch-invariant tiles are smaller: their scores are computed for every
  // key of the tile's last row, so a causal tile wastes up to half a tile
  // of keys per row.
  static constexpr int64_t kInvariantTileRows = 32;

  // Scores capped as PagedAttentionArgs::softcap says (each on its own, so
  // the row and tile paths give the same bits).
  static void SoftCap(const PagedAttentionArgs& a, float* s, int64_t n) {
    if (a.softcap <= 0) return;
    for (int64_t i = 0; i < n; ++i) s[i] = a.softcap * std::tanh(s[i] / a.softcap);
  }

  // The first key a query at `pos` sees: 0, or the start of its window.
  static int64_t FirstKey(const PagedAttentionArgs& a, int64_t pos) {
    return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  }

  // Row j of K (kv 0) or V (kv 1) of `seq` at KV head `kvh` of the call's
  // range (a.kv_head_begin + kvh of the pool), in an f32 pool.
  static const float* PoolRow(const PagedAttentionArgs& a, const AttentionSeq& seq, int64_t kv, int64_t kvh,
                              int64_t j) {
    const KvLayout& l = a.layout;
    return reinterpret_cast<const float*>(
        l.At(a.kv, l.Offset(seq.block_table[j / l.block_size], a.layer, kv, a.kv_head_begin + kvh, j % l.block_size)));
  }
  // Positions [lo, hi] of K or V into buf as [hi - lo + 1][head_dim] floats,
  // a block-sized run at a time.
  static void GatherKv(const PagedAttentionArgs& a, const AttentionSeq& seq, int64_t kv, int64_t kvh, int64_t lo,
                       int64_t hi, float* buf) {
    const KvLayout& l = a.layout;
    const int64_t hd = l.head_dim;
    for (int64_t j = lo; j <= hi;) {
      const int64_t slot = j % l.block_size;
      const int64_t run = std::min(l.block_size - slot, hi - j + 1);
      const int32_t block = seq.block_table[j / l.block_size];
      simd::Widen(l.At(a.kv, l.Offset(block, a.layer, kv, a.kv_head_begin + kvh, slot)), l.dtype, run * hd,
                  buf + (j - lo) * hd);
      j += run;
    }
  }

  // Query row `local` of `seq` against KV head `kvh`, for each query head of
  // its group: dot products, softmax, weighted sum of V. An f32 pool is read
  // in place; a bf16 or f16 one is widened into `scratch` first, so every
  // dtype runs the same float loops.
  static void AttentionRow(const PagedAttentionArgs& a, const AttentionSeq& seq, int64_t local,
                           int64_t kvh, std::vector<float>& scratch) {
    const KvLayout& l = a.layout;
    const int64_t hd = l.head_dim;
    const int64_t group = a.num_q_heads / a.KvHeads();
    const int64_t row = seq.first_row + local;
    const int64_t pos = seq.start_pos + local;
    const int64_t lo = FirstKey(a, pos);
    const int64_t len = pos - lo + 1;
    const bool widen = l.dtype != DType::kF32;
    scratch.resize(static_cast<size_t>(len + (widen ? 2 * len * hd : 0)));
    float* scores = scratch.data();
    float* kbuf = scores + len;
    float* vbuf = kbuf + len * hd;
    if (widen) {
      GatherKv(a, seq, 0, kvh, lo, pos, kbuf);
      GatherKv(a, seq, 1, kvh, lo, pos, vbuf);
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      const float* q = a.q + (row * a.num_q_heads + h) * hd;
      for (int64_t j = lo; j <= pos; ++j) {
        const float* k = widen ? kbuf + (j - lo) * hd : PoolRow(a, seq, 0, kvh, j);
        scores[j - lo] = simd::Dot(q, k, hd) * a.scale;
      }
      SoftCap(a, scores, len);
      float sum = simd::ExpShiftSum(scores, simd::Max(scores, len), len);
      float inv = 1.0f / sum;
      float* o = a.out + (row * a.num_q_heads + h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = lo; j <= pos; ++j) {
        const float* v = widen ? vbuf + (j - lo) * hd : PoolRow(a, seq, 1, kvh, j);
        simd::Axpy(scores[j - lo] * inv, v, o, hd);
      }
    }
  }

  // Rows [first, first + rows) of `seq` against KV head `kvh`, per query
  // head: scores S = Q K^T over the keys any row of the tile may see, each
  // row's softmax over its own keys (the others zeroed), then O = P V.
  // Batch-invariant (`invariant`), each row gets the bits AttentionRow gives
  // it: S by simd::DotRows (Dot's bits) then scaled, O by simd::AxpyRows
  // (Axpy's bits; a zero weight adds nothing), rows four at a time over the
  // keys any of them sees. Otherwise S and O are OpenBLAS GEMMs.
  static void AttentionTile(const PagedAttentionArgs& a, const AttentionSeq& seq, int64_t first, int64_t rows,
                            int64_t kvh, bool invariant, std::vector<float>& scratch) {
    const KvLayout& l = a.layout;
    const int64_t hd = l.head_dim;
    const int64_t group = a.num_q_heads / a.KvHeads();
    const int64_t pos0 = seq.start_pos + first;
    const int64_t pos_last = pos0 + rows - 1;
    const int64_t k_lo = FirstKey(a, pos0);
    const int64_t nkeys = pos_last - k_lo + 1;
    scratch.resize(2 * nkeys * hd + rows * nkeys + (invariant ? rows * hd : 0));
    float* kbuf = scratch.data();
    float* vbuf = kbuf + nkeys * hd;
    float* sbuf = vbuf + nkeys * hd;
    float* qbuf = sbuf + rows * nkeys;  // invariant: the tile's query rows, contiguous
    // The keys and values as contiguous [nkeys][hd] float matrices.
    GatherKv(a, seq, 0, kvh, k_lo, pos_last, kbuf);
    GatherKv(a, seq, 1, kvh, k_lo, pos_last, vbuf);
    const int64_t ld_q = a.num_q_heads * hd;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      const float* q = a.q + ((seq.first_row + first) * a.num_q_heads + h) * hd;
      if (invariant) {
        for (int64_t r = 0; r < rows; ++r) std::memcpy(qbuf + r * hd, q + r * ld_q, hd * sizeof(float));
        simd::DotRows(qbuf, rows, kbuf, nkeys, hd, sbuf, nkeys, /*accumulate=*/false);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nkeys, hd, a.scale, q, ld_q, kbuf,
                    hd, 0.0f, sbuf, nkeys);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t pos = pos0 + r;
        const int64_t lo = FirstKey(a, pos);
        float* srow = sbuf + r * nkeys;
        float* valid = srow + (lo - k_lo);
        const int64_t len = pos - lo + 1;
        if (invariant) simd::Scale(valid, a.scale, len);  // As AttentionRow: Dot(q, k) * scale.
        SoftCap(a, valid, len);
        float sum = simd::ExpShiftSum(valid, simd::Max(valid, len), len);
        simd::Scale(valid, 1.0f / sum, len);
        std::fill(srow, valid, 0.0f);
        std::fill(valid + len, srow + nkeys, 0.0f);
      }
      float* o = a.out + ((seq.first_row + first) * a.num_q_heads + h) * hd;
      if (!invariant) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nkeys, 1.0f, sbuf, nkeys,
                    vbuf, hd, 0.0f, o, ld_q);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) std::fill(o + r * ld_q, o + r * ld_q + hd, 0.0f);
      for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        const int64_t r1 = std::min(rows, r0 + 4);
        const int64_t j0 = FirstKey(a, pos0 + r0) - k_lo, j1 = pos0 + r1 - k_lo;
        simd::AxpyRows(sbuf + r0 * nkeys + j0, nkeys, r1 - r0, vbuf + j0 * hd, j1 - j0, hd, o + r0 * ld_q, ld_q);
      }
    }
  }

  const bool invariant_;
  const bool int8_;  // kInt8Activations: DotRowsInt8 for quantized weights.
  ThreadPool pool_;
};

}  // namespace

KernelBackendPtr NewCpuBackend(int threads, CpuKernels kernels) {
  if (threads <= 0) threads = AvailableCores();
  return std::make_unique<CpuBackend>(threads, kernels);
}

const char* CpuInstructionSet() {
  if (simd::UseAvx512()) return "AVX-512";
  return simd::UseAvx2() ? "AVX2" : "scalar";
}

}  // namespace duet::kernels

#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace duet::kernels::ref {

void Gemm(const float* a, const float* w, float* c, int64_t m, int64_t n, int64_t k,
          bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = accumulate ? c[i * n + j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * w[j * k + p];
      c[i * n + j] = static_cast<float>(s);
    }
  }
}

void Gemm(const float* a, const WeightMatrix& w, float* c, int64_t m, bool accumulate) {
  const std::vector<float> dense = Dequantize(w);
  Gemm(a, dense.data(), c, m, w.n, w.k, accumulate);
}

void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      y[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * w[i]);
    }
  }
}

void Rope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
          int64_t num_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // The angle in float32, as Hugging Face computes it.
        float angle = static_cast<float>(positions[t]) * inv_freq[i];
        double c = std::cos(angle), s = std::sin(angle);
        double x1 = v[i], x2 = v[i + half];
        v[i] = static_cast<float>(x1 * c - x2 * s);
        v[i + half] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
}

void SiluMul(const float* gu, float* out, int64_t rows, int64_t inter) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * inter;
    const float* u = g + inter;
    for (int64_t i = 0; i < inter; ++i) {
      double gv = g[i];
      out[r * inter + i] = static_cast<float>(gv / (1.0 + std::exp(-gv)) * u[i]);
    }
  }
}

void GeluTanhMul(const float* gu, float* out, int64_t rows, int64_t inter) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * inter;
    const float* u = g + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const double x = g[i];
      out[r * inter + i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x))) * u[i]);
    }
  }
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void PagedAttention(const PagedAttentionArgs& a) {
  const KvLayout& l = a.layout;
  const int64_t hd = l.head_dim;
  const int64_t group = a.num_q_heads / a.KvHeads();
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const AttentionSeq& seq = a.seqs[s];
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t row = seq.first_row + i;
      const int64_t pos = seq.start_pos + i;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      for (int64_t h = 0; h < a.num_q_heads; ++h) {
        const int64_t kvh = a.kv_head_begin + h / group;
        const float* q = a.q + (row * a.num_q_heads + h) * hd;
        std::vector<double> scores(pos - lo + 1);
        double mx = -1e300;
        for (int64_t j = lo; j <= pos; ++j) {
          const int64_t k = l.Offset(seq.block_table[j / l.block_size], a.layer, 0, kvh, j % l.block_size);
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(q[e]) * l.Value(a.kv, k + e);
          scores[j - lo] = d * a.scale;
          if (a.softcap > 0) scores[j - lo] = a.softcap * std::tanh(scores[j - lo] / a.softcap);
          mx = std::max(mx, scores[j - lo]);
        }
        double sum = 0;
        for (double& v : scores) sum += (v = std::exp(v - mx));
        std::vector<double> acc(hd, 0.0);
        for (int64_t j = lo; j <= pos; ++j) {
          const int64_t v = l.Offset(seq.block_table[j / l.block_size], a.layer, 1, kvh, j % l.block_size);
          for (int64_t e = 0; e < hd; ++e) acc[e] += scores[j - lo] / sum * l.Value(a.kv, v + e);
        }
        float* o = a.out + (row * a.num_q_heads + h) * hd;
        for (int64_t e = 0; e < hd; ++e) o[e] = static_cast<float>(acc[e]);
      }
    }
  }
}

void KvStore(const KvStoreArgs& a) {
  const KvLayout& l = a.layout;
  const int64_t nkv = a.KvHeads();
  for (int64_t r = 0; r < a.rows; ++r) {
    if (a.slots[r] < 0) continue;
    const int64_t block = a.slots[r] / l.block_size, slot = a.slots[r] % l.block_size;
    for (int64_t h = 0; h < nkv; ++h) {
      const int64_t from = (r * nkv + h) * l.head_dim;
      l.Store(a.kv, l.Offset(block, a.layer, 0, a.kv_head_begin + h, slot), a.k + from, l.head_dim);
      l.Store(a.kv, l.Offset(block, a.layer, 1, a.kv_head_begin + h, slot), a.v + from, l.head_dim);
    }
  }
}

void Add(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim, float* out) {
  for (int64_t i = 0; i < num_rows; ++i) {
    for (int64_t d = 0; d < dim; ++d) out[i * dim + d] = x[static_cast<int64_t>(rows[i]) * dim + d];
  }
}

void Copy2D(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

void Moe(const MoeArgs& a) {
  const int64_t H = a.hidden(), I = a.inter(), K = a.top_k;
  std::vector<std::vector<float>> gate_up(a.num_experts), down(a.num_experts);  // dequantized once
  std::vector<int32_t> experts(K);
  std::vector<float> weights(K), gu(2 * I), act(I), y(H);
  for (int64_t r = 0; r < a.rows; ++r) {
    RouteRow(a.scores + r * a.num_experts, a.num_experts, K, a.renormalize, experts.data(), weights.data());
    std::vector<double> sum(H, 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = experts[j];
      if (gate_up[e].empty()) {
        gate_up[e] = Dequantize(a.experts[e].gate_up);
        down[e] = Dequantize(a.experts[e].down);
      }
      Gemm(a.x + r * H, gate_up[e].data(), gu.data(), 1, 2 * I, H, false);
      SiluMul(gu.data(), act.data(), 1, I);
      Gemm(act.data(), down[e].data(), y.data(), 1, H, I, false);
      for (int64_t i = 0; i < H; ++i) sum[i] += static_cast<double>(weights[j]) * y[i];
    }
    for (int64_t i = 0; i < H; ++i) a.out[r * H + i] = static_cast<float>(sum[i]);
  }
}

}  // namespace duet::kernels::ref

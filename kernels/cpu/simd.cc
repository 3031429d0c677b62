#include "kernels/cpu/simd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

namespace duet::kernels::simd {
namespace {

bool DetectAvx2() {
  const char* off = std::getenv("DUET_NO_AVX2");
  if (off != nullptr && std::strcmp(off, "1") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#define DUET_AVX2 __attribute__((target("avx2,fma,f16c")))
// AVX-512 (F, BW, DQ, VL): the same dots on 16 lanes, lanes 0-7 the AVX2
// code's first accumulator and 8-15 its second, so every output is the
// same bits on either path (and the AVX2 path still runs where AVX-512 is
// missing, or with DUET_NO_AVX512=1).
#define DUET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

bool DetectAvx512() {
  const char* off = std::getenv("DUET_NO_AVX512");
  if (off != nullptr && std::strcmp(off, "1") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

DUET_AVX2 inline float HSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

DUET_AVX2 inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// exp(x) for float lanes: Cephes' range reduction and degree-5 polynomial,
// about 1e-7 relative error on [-88, 88].
DUET_AVX2 inline __m256 Exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i n = _mm256_cvttps_epi32(fx);
  n = _mm256_add_epi32(n, _mm256_set1_epi32(127));
  n = _mm256_slli_epi32(n, 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// A dot product's end, after its 16-wide steps filled s0 (lanes 0-7) and
// s1 (lanes 8-15) up to element i: one more 8-wide step when it fits, the
// lanes summed, then the tail an element at a time. Dot and DotRows share
// it, so a dot is the same bits whichever computes it.
DUET_AVX2 inline float FinishDot(__m256 s0, __m256 s1, const float* a, const float* b, int64_t i, int64_t n) {
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = HSum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

DUET_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  return FinishDot(s0, s1, a, b, i, n);
}

// Weight rows whose floats fill about 256 KiB (a share of L2, where a block
// of them stays while every row of a passes over it), a multiple of `tile`
// (the weight rows of a register tile), at least one tile.
inline int64_t L2Rows(int64_t k, int64_t tile) {
  return std::max<int64_t>(tile, (int64_t{256} << 10) / (4 * std::max<int64_t>(1, k)) / tile * tile);
}

// How far ahead a one-row GEMV prefetches: about 6 KiB (the rows of a tile
// or two on). Measured on a cold matrix, the hardware prefetchers alone
// fed q8 at half speed.
inline int64_t PrefetchAhead(int64_t row_bytes) {
  return std::max<int64_t>(4, (6144 + row_bytes - 1) / row_bytes) * row_bytes;
}

// One weight row of each non-F32 dtype, read eight floats at a time (from
// an offset that is a multiple of 8, with 8 more inside k) or one, each the
// value kernels/dtype.h defines (one rounding, as DequantizeRow gives it).
// Load16(i, w0, w1), for i a multiple of 16 with 16 more inside the row's
// stored length, gives the same values as Load8(i) and Load8(i + 8) with
// fewer instructions (a quantized block unpacked once per half); Load512(i)
// gives them in one 16-lane vector.
struct F32Row {
  const float* p;
  DUET_AVX2 void Load16(int64_t i, __m256& w0, __m256& w1) const {
    w0 = _mm256_loadu_ps(p + i);
    w1 = _mm256_loadu_ps(p + i + 8);
  }
  DUET_AVX2 void Load32(int64_t i, __m256* w) const {
    for (int t = 0; t < 4; ++t) w[t] = _mm256_loadu_ps(p + i + 8 * t);
  }
  DUET_AVX512 __m512 Load512(int64_t i) const { return _mm512_loadu_ps(p + i); }
  DUET_AVX512 void Load32(int64_t i, __m512& w0, __m512& w1) const {
    w0 = _mm512_loadu_ps(p + i);
    w1 = _mm512_loadu_ps(p + i + 16);
  }
  float At(int64_t i) const { return p[i]; }
  const char* Addr(int64_t i) const { return reinterpret_cast<const char*>(p + i); }
};

struct Bf16Row {
  const uint16_t* p;
  DUET_AVX2 __m256 Load8(int64_t i) const {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  DUET_AVX2 void Load16(int64_t i, __m256& w0, __m256& w1) const {
    w0 = Load8(i);
    w1 = Load8(i + 8);
  }
  DUET_AVX2 void Load32(int64_t i, __m256* w) const {
    for (int t = 0; t < 4; ++t) w[t] = Load8(i + 8 * t);
  }
  DUET_AVX512 __m512 Load512(int64_t i) const {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  DUET_AVX512 void Load32(int64_t i, __m512& w0, __m512& w1) const {
    w0 = Load512(i);
    w1 = Load512(i + 16);
  }
  float At(int64_t i) const { return Bf16ToFloat(p[i]); }
  const char* Addr(int64_t i) const { return reinterpret_cast<const char*>(p + i); }
};

struct F16Row {
  const uint16_t* p;
  DUET_AVX2 __m256 Load8(int64_t i) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
  }
  DUET_AVX2 void Load16(int64_t i, __m256& w0, __m256& w1) const {
    w0 = Load8(i);
    w1 = Load8(i + 8);
  }
  DUET_AVX2 void Load32(int64_t i, __m256* w) const {
    for (int t = 0; t < 4; ++t) w[t] = Load8(i + 8 * t);
  }
  DUET_AVX512 __m512 Load512(int64_t i) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
  }
  DUET_AVX512 void Load32(int64_t i, __m512& w0, __m512& w1) const {
    w0 = Load512(i);
    w1 = Load512(i + 16);
  }
  float At(int64_t i) const { return HalfToFloat(p[i]); }
  const char* Addr(int64_t i) const { return reinterpret_cast<const char*>(p + i); }
};

// A block's index from an element's (non-negative) offset.
inline int64_t BlockOf(int64_t i) { return static_cast<int64_t>(static_cast<uint64_t>(i) / kQuantBlock); }

// A quantized block's 32 integers (int8, in element order) times its
// scale: four vectors of 8 floats, each value one rounding (kernels/dtype.h).
DUET_AVX2 inline void ScaleBlockAvx2(__m256i v, __m256 scale, __m256* w) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), scale);
  w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), scale);
  w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), scale);
  w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), scale);
}

struct Q8Row {
  static constexpr int kBlockBytes = kQuantBlock;  // stored bytes of a block's values
  const int8_t* q;
  const float* scales;
  DUET_AVX2 __m256 Load8(int64_t i) const {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i))));
    return _mm256_mul_ps(v, _mm256_broadcast_ss(scales + BlockOf(i)));
  }
  DUET_AVX2 void Load16(int64_t i, __m256& w0, __m256& w1) const {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m256 scale = _mm256_broadcast_ss(scales + BlockOf(i));
    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), scale);
    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), scale);
  }
  // A whole block (i a multiple of 32): one load, four conversions.
  DUET_AVX2 void Load32(int64_t i, __m256* w) const {
    ScaleBlockAvx2(LoadInt8(BlockOf(i)), _mm256_broadcast_ss(scales + BlockOf(i)), w);
  }
  DUET_AVX512 __m512 Load512(int64_t i) const {
    const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(scales[BlockOf(i)]));
  }
  DUET_AVX512 void Load32(int64_t i, __m512& w0, __m512& w1) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    const __m512 scale = _mm512_set1_ps(scales[BlockOf(i)]);
    w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))), scale);
    w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))), scale);
  }
  // Block b's 32 integers, as int8.
  DUET_AVX2 __m256i LoadInt8(int64_t b) const {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kQuantBlock));
  }
  int Int(int64_t i) const { return q[i]; }
  float At(int64_t i) const { return static_cast<float>(q[i]) * scales[BlockOf(i)]; }
  const char* Addr(int64_t i) const { return reinterpret_cast<const char*>(q + i); }
};

// kQ4 (zeros null: 8) and kQ4Z.
struct Q4Row {
  static constexpr int kBlockBytes = kQuantBlock / 2;
  const uint8_t* q;
  const float* scales;
  const uint8_t* zeros;
  int Zero(int64_t b) const { return zeros != nullptr ? zeros[b] : 8; }
  DUET_AVX2 __m256 Load8(int64_t i) const {
    const int64_t b = BlockOf(i), e = i % kQuantBlock;
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * kQuantBlock / 2 + e % 16));
    __m256i v = _mm256_cvtepu8_epi32(bytes);
    if (e >= 16) v = _mm256_srli_epi32(v, 4);
    v = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x0f)), _mm256_set1_epi32(Zero(b)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_broadcast_ss(scales + b));
  }
  // Elements 0-15 of a block are its bytes' low nibbles, 16-31 their high
  // ones; q - zero lies in [-16, 15], exact in int8.
  DUET_AVX2 void Load16(int64_t i, __m256& w0, __m256& w1) const {
    const int64_t b = BlockOf(i);
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQuantBlock / 2));
    if (i % kQuantBlock != 0) v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(0x0f)), _mm_set1_epi8(static_cast<char>(Zero(b))));
    const __m256 scale = _mm256_broadcast_ss(scales + b);
    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), scale);
    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), scale);
  }
  // A whole block (i a multiple of 32): its 16 bytes loaded once, low
  // nibbles then high ones.
  DUET_AVX2 void Load32(int64_t i, __m256* w) const {
    ScaleBlockAvx2(LoadInt8(BlockOf(i)), _mm256_broadcast_ss(scales + BlockOf(i)), w);
  }
  DUET_AVX512 __m512 Load512(int64_t i) const {
    const int64_t b = BlockOf(i);
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQuantBlock / 2));
    if (i % kQuantBlock != 0) v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(0x0f)), _mm_set1_epi8(static_cast<char>(Zero(b))));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), _mm512_set1_ps(scales[b]));
  }
  // A whole block: its 16 possible values, (q - zero) x scale with the same
  // rounding as Load512, in one register, looked up by each nibble (vpermps
  // reads an index's low 4 bits).
  DUET_AVX512 void Load32(int64_t i, __m512& w0, __m512& w1) const {
    const int64_t b = BlockOf(i);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(Zero(b)))),
                                       _mm512_set1_ps(scales[b]));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQuantBlock / 2)));
    w0 = _mm512_permutexvar_ps(v, table);
    w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  }
  // Block b's 32 nibbles q (0..15), as bytes in element order: its 16
  // bytes in both halves of the register, the upper half shifted by 4.
  DUET_AVX2 __m256i LoadNibbles(int64_t b) const {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kQuantBlock / 2));
    const __m256i v = _mm256_broadcastsi128_si256(bytes);
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
  }
  // Block b's 32 integers q - zero (in [-16, 15]), as int8.
  DUET_AVX2 __m256i LoadInt8(int64_t b) const {
    return _mm256_sub_epi8(LoadNibbles(b), _mm256_set1_epi8(static_cast<char>(Zero(b))));
  }
  int Int(int64_t i) const {
    const int64_t b = BlockOf(i);
    return Nibble(q + b * kQuantBlock / 2, i % kQuantBlock) - Zero(b);
  }
  float At(int64_t i) const {
    const int64_t b = BlockOf(i);
    return static_cast<float>(Nibble(q + b * kQuantBlock / 2, i % kQuantBlock) - Zero(b)) * scales[b];
  }
  const char* Addr(int64_t i) const { return reinterpret_cast<const char*>(q + i / 2); }
};

// Row j of `w` as its dtype's loader.
template <class Row>
Row RowOf(const WeightMatrix& w, int64_t j);
template <>
Bf16Row RowOf(const WeightMatrix& w, int64_t j) {
  return {static_cast<const uint16_t*>(w.values) + j * w.k};
}
template <>
F16Row RowOf(const WeightMatrix& w, int64_t j) {
  return {static_cast<const uint16_t*>(w.values) + j * w.k};
}
template <>
Q8Row RowOf(const WeightMatrix& w, int64_t j) {
  return {static_cast<const int8_t*>(w.values) + j * w.RowBytes(), w.scales + j * QuantBlocks(w.k)};
}
template <>
Q4Row RowOf(const WeightMatrix& w, int64_t j) {
  const int64_t b = QuantBlocks(w.k);
  return {static_cast<const uint8_t*>(w.values) + j * w.RowBytes(), w.scales + j * b,
          w.zeros != nullptr ? w.zeros + j * b : nullptr};
}

// The first k values of a row, as floats.
template <class Row>
DUET_AVX2 void WidenAvx2(const Row& row, int64_t k, float* o) {
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256 w0, w1;
    row.Load16(i, w0, w1);
    _mm256_storeu_ps(o + i, w0);
    _mm256_storeu_ps(o + i + 8, w1);
  }
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(o + i, row.Load8(i));
  for (; i < k; ++i) o[i] = row.At(i);
}

// One row of a against C rows of a non-F32 `w`, the weights converted in
// registers as the loop reaches them: each output the same bits as
// DotTileAvx2 over WidenAvx2's floats (the same values, the same lanes and
// order; the tail widened into a buffer for FinishDot). A decode step's
// GEMV, where nothing would reuse a converted block.
template <int C, class Row>
DUET_AVX2 inline void DotTileRowsAvx2(const float* a, const Row* rows, int64_t k, float* c, bool accumulate,
                                     int64_t ahead) {
  __m256 s0[C], s1[C];
  for (int j = 0; j < C; ++j) s0[j] = s1[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256 av[4];
    for (int t = 0; t < 4; ++t) av[t] = _mm256_loadu_ps(a + i + 8 * t);
    for (int j = 0; j < C; ++j) {
      _mm_prefetch(rows[j].Addr(i) + ahead, _MM_HINT_T0);
      __m256 w[4];
      rows[j].Load32(i, w);
      s0[j] = _mm256_fmadd_ps(av[0], w[0], s0[j]);
      s1[j] = _mm256_fmadd_ps(av[1], w[1], s1[j]);
      s0[j] = _mm256_fmadd_ps(av[2], w[2], s0[j]);
      s1[j] = _mm256_fmadd_ps(av[3], w[3], s1[j]);
    }
  }
  for (; i + 16 <= k; i += 16) {
    const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
    for (int j = 0; j < C; ++j) {
      __m256 w0, w1;
      rows[j].Load16(i, w0, w1);
      s0[j] = _mm256_fmadd_ps(a0, w0, s0[j]);
      s1[j] = _mm256_fmadd_ps(a1, w1, s1[j]);
    }
  }
  for (int j = 0; j < C; ++j) {
    float tail[16] = {};
    for (int64_t t = i; t < k; ++t) tail[t - i] = rows[j].At(t);
    const float d = FinishDot(s0[j], s1[j], a + i, tail, 0, k - i);
    c[j] = accumulate ? c[j] + d : d;
  }
}


// One row of a against rows [0, n) of row_at (a decode step's GEMV): four
// weight rows a tile, prefetched ahead.
template <class RowAt>
DUET_AVX2 void DotRowAvx2(const float* a, const RowAt& row_at, int64_t n, int64_t k, int64_t row_bytes, float* c,
                          bool accumulate) {
  const int64_t ahead = PrefetchAhead(row_bytes);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const decltype(row_at(0)) rows[4] = {row_at(j), row_at(j + 1), row_at(j + 2), row_at(j + 3)};
    DotTileRowsAvx2<4>(a, rows, k, c + j, accumulate, ahead);
  }
  for (; j < n; ++j) {
    const auto row = row_at(j);
    DotTileRowsAvx2<1>(a, &row, k, c + j, accumulate, ahead);
  }
}

// The AVX2 GEMM from two rows of a on. A block of weight rows (about 256
// KiB of floats, in L2 while every row of a passes over it) is packed
// into tiles of C = 3 rows (the last one or two rows tiles of one), each
// tile one run of floats: for parity h = 0, 1 and each 16-float step s of
// k, the tile's C chunks of 8 floats at 16 s + 8 h; then each row's tail
// past the last whole step (k % 16 floats, zero-padded to 16). Each pass
// over a tile accumulates one parity, one register per output: the
// chunks at 0, 16, 32, ... make DotAvx2's s0 and those at 8, 24, ... its
// s1, each with the same multiply-adds in the same order, so every output
// is DotAvx2's bits whatever m is. One register per output lets a tile of
// 4 rows of a x 3 weight rows live in AVX2's 16 registers (both
// accumulators at once allowed 3 x 2), and the packed tile is one stream;
// on the prefill shapes this ran at 0.9 of OpenBLAS's AVX2 SGEMM, where
// the unpacked 3 x 2 tiles ran at 0.5. Packing converts a non-F32 dtype's
// rows as it goes, so they are converted once per block.
constexpr int kPackC = 3;

inline int64_t PackedRowFloats(int64_t k) { return k / 16 * 16 + 16; }

template <class Row>
DUET_AVX2 void PackTileAvx2(const Row* rows, int c, int64_t k, float* out) {
  const int64_t steps = k / 16;
  for (int64_t s = 0; s < steps; ++s) {
    for (int j = 0; j < c; ++j) {
      __m256 w0, w1;
      rows[j].Load16(16 * s, w0, w1);
      _mm256_storeu_ps(out + (s * c + j) * 8, w0);
      _mm256_storeu_ps(out + ((steps + s) * c + j) * 8, w1);
    }
  }
  float* tail = out + 2 * steps * c * 8;
  for (int j = 0; j < c; ++j) {
    for (int64_t t = 0; t < 16; ++t) tail[j * 16 + t] = 16 * steps + t < k ? rows[j].At(16 * steps + t) : 0.0f;
  }
}

// Prefetches of weights still in memory, spread over a tile's passes: the
// u-th 16-float step of a pass touches the lines of [p + u * stride,
// p + (u + 1) * stride), so one pass covers stride x steps bytes.
struct PassPrefetch {
  const char* p = nullptr;
  int64_t stride = 0;
  DUET_AVX2 void At(int64_t u) const {
    if (p == nullptr) return;
    for (int64_t o = 0; o < stride; o += 64) _mm_prefetch(p + u * stride + o, _MM_HINT_T0);
  }
  PassPrefetch Next(int64_t steps) const { return p == nullptr ? *this : PassPrefetch{p + steps * stride, stride}; }
};

// acc[r * C + j] = the parity-h chunks of a's row r dotted with the packed
// tile's row j (w: the tile's chunks of that parity).
template <int R, int C, bool kPrefetch>
DUET_AVX2 inline void DotPassAvx2(const float* a, int64_t k, int h, const float* w, int64_t steps, __m256* acc,
                                  const PassPrefetch& pf) {
  __m256 s[R][C];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) s[r][j] = _mm256_setzero_ps();
  }
  a += 8 * h;
  for (int64_t t = 0; t < steps; ++t) {
    if constexpr (kPrefetch) pf.At(t);
    __m256 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = _mm256_loadu_ps(w + (t * C + j) * 8);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_loadu_ps(a + r * k + 16 * t);
      for (int j = 0; j < C; ++j) s[r][j] = _mm256_fmadd_ps(av, wv[j], s[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) acc[r * C + j] = s[r][j];
  }
}

template <int R, int C, bool kPrefetch = false>
DUET_AVX2 inline void DotPackedTileAvx2(const float* a, int64_t k, const float* tile, float* c, int64_t ldc,
                                        bool accumulate, const PassPrefetch& pf = {}) {
  const int64_t steps = k / 16;
  __m256 s0[R * C], s1[R * C];
  DotPassAvx2<R, C, kPrefetch>(a, k, 0, tile, steps, s0, pf);
  DotPassAvx2<R, C, kPrefetch>(a, k, 1, tile + steps * C * 8, steps, s1, pf.Next(steps));
  const float* tail = tile + 2 * steps * C * 8;
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) {
      const float d = FinishDot(s0[r * C + j], s1[r * C + j], a + r * k + 16 * steps, tail + j * 16, 0, k - 16 * steps);
      float& out = c[r * ldc + j];
      out = accumulate ? out + d : d;
    }
  }
}

template <int R>
DUET_AVX2 void DotPackedBlockAvx2(const float* a, int64_t k, const float* packed, int64_t cols, float* c, int64_t ldc,
                                  bool accumulate) {
  const int64_t row_floats = PackedRowFloats(k);
  int64_t j = 0;
  for (; j + kPackC <= cols; j += kPackC) {
    DotPackedTileAvx2<R, kPackC>(a, k, packed + j * row_floats, c + j, ldc, accumulate);
  }
  for (; j < cols; ++j) DotPackedTileAvx2<R, 1>(a, k, packed + j * row_floats, c + j, ldc, accumulate);
}

// c[i * ldc + j] (+)= row i of a . row_at(j) for i < m, j < n (m >= 2).
template <class RowAt>
DUET_AVX2 void DotRowsPackedAvx2(const float* a, int64_t m, const RowAt& row_at, int64_t n, int64_t k, float* c,
                                 int64_t ldc, bool accumulate) {
  const int64_t row_floats = PackedRowFloats(k);
  const int64_t block = std::max<int64_t>(kPackC, (int64_t{256} << 10) / (4 * row_floats) / kPackC * kPackC);
  thread_local std::vector<float> packed;
  packed.resize(static_cast<size_t>(std::min(block, n) * row_floats));
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t cols = std::min(block, n - j0);
    int64_t j = 0;
    for (; j + kPackC <= cols; j += kPackC) {
      decltype(row_at(0)) rows[kPackC];
      for (int t = 0; t < kPackC; ++t) rows[t] = row_at(j0 + j + t);
      PackTileAvx2(rows, kPackC, k, packed.data() + j * row_floats);
    }
    for (; j < cols; ++j) {
      const auto row = row_at(j0 + j);
      PackTileAvx2(&row, 1, k, packed.data() + j * row_floats);
    }
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) DotPackedBlockAvx2<4>(a + i * k, k, packed.data(), cols, c + i * ldc + j0, ldc, accumulate);
    const float* ai = a + i * k;
    float* ci = c + i * ldc + j0;
    if (m - i == 3) DotPackedBlockAvx2<3>(ai, k, packed.data(), cols, ci, ldc, accumulate);
    if (m - i == 2) DotPackedBlockAvx2<2>(ai, k, packed.data(), cols, ci, ldc, accumulate);
    if (m - i == 1) DotPackedBlockAvx2<1>(ai, k, packed.data(), cols, ci, ldc, accumulate);
  }
}

// A few rows of a (a batched decode step, an expert's tokens): the
// weights stream a tile at a time. Each tile of kPackC rows is packed
// (into L1) and every row of a passes over it before the next, so each
// weight is read from memory once per call; the rows some 6 KiB on are
// prefetched meanwhile, a tile's worth spread over each tile's passes, so
// memory stays busy while the tiles compute (the L2 blocks above left it
// idle while a block's tiles ran: 8 rows ran at 0.4 of a one-row GEMV's
// rate, and now at 0.6-0.8). While a's rows fit 128 KiB (in L2 beside the
// tiles); beyond, the L2 blocks' reuse wins.
inline bool StreamsRows(int64_t m, int64_t k) { return m * k <= 32 * 1024; }

// The distance ahead and the per-step stride of a streaming kernel's
// prefetches: `passes` passes of k / 16 steps over each tile of `tile_bytes`.
inline PassPrefetch StreamPrefetch(const char* tile, int64_t row_bytes, int64_t tile_bytes, int64_t passes, int64_t k) {
  const int64_t ahead = (PrefetchAhead(row_bytes) + tile_bytes - 1) / tile_bytes * tile_bytes;
  const int64_t steps = std::max<int64_t>(1, passes * (k / 16));
  return {tile + ahead, (tile_bytes + steps - 1) / steps};
}

template <class RowAt>
DUET_AVX2 void DotRowsStreamAvx2(const float* a, int64_t m, const RowAt& row_at, int64_t n, int64_t k,
                                 int64_t row_bytes, float* c, int64_t ldc, bool accumulate) {
  const int64_t row_floats = PackedRowFloats(k), steps = k / 16;
  thread_local std::vector<float> tile;
  tile.resize(static_cast<size_t>(kPackC * row_floats));
  for (int64_t j = 0; j < n; j += kPackC) {
    const int cols = static_cast<int>(std::min<int64_t>(kPackC, n - j));
    decltype(row_at(0)) rows[kPackC];
    for (int t = 0; t < cols; ++t) rows[t] = row_at(j + t);
    if (cols == kPackC) {
      PackTileAvx2(rows, kPackC, k, tile.data());
    } else {
      for (int t = 0; t < cols; ++t) PackTileAvx2(&rows[t], 1, k, tile.data() + t * row_floats);
    }
    PassPrefetch pf = StreamPrefetch(rows[0].Addr(0), row_bytes, kPackC * row_bytes, 2 * ((m + 3) / 4), k);
    int64_t i = 0;
    for (; i < m; i += 4, pf = pf.Next(2 * steps)) {
      const float* ai = a + i * k;
      float* ci = c + i * ldc + j;
      const int64_t r = std::min<int64_t>(4, m - i);
      if (cols == kPackC) {
        if (r == 4) DotPackedTileAvx2<4, kPackC, true>(ai, k, tile.data(), ci, ldc, accumulate, pf);
        if (r == 3) DotPackedTileAvx2<3, kPackC, true>(ai, k, tile.data(), ci, ldc, accumulate, pf);
        if (r == 2) DotPackedTileAvx2<2, kPackC, true>(ai, k, tile.data(), ci, ldc, accumulate, pf);
        if (r == 1) DotPackedTileAvx2<1, kPackC, true>(ai, k, tile.data(), ci, ldc, accumulate, pf);
      } else {
        for (int t = 0; t < cols; ++t) {
          const float* tt = tile.data() + t * row_floats;
          if (r == 4) DotPackedTileAvx2<4, 1>(ai, k, tt, ci + t, ldc, accumulate);
          if (r == 3) DotPackedTileAvx2<3, 1>(ai, k, tt, ci + t, ldc, accumulate);
          if (r == 2) DotPackedTileAvx2<2, 1>(ai, k, tt, ci + t, ldc, accumulate);
          if (r == 1) DotPackedTileAvx2<1, 1>(ai, k, tt, ci + t, ldc, accumulate);
        }
      }
    }
  }
}

DUET_AVX2 void DotRowsAvx2(const float* a, int64_t m, const float* w, int64_t n, int64_t k, float* c, int64_t ldc,
                           bool accumulate) {
  const auto row_at = [w, k](int64_t j) { return F32Row{w + j * k}; };
  if (m == 1) return DotRowAvx2(a, row_at, n, k, 4 * k, c, accumulate);
  if (StreamsRows(m, k)) return DotRowsStreamAvx2(a, m, row_at, n, k, 4 * k, c, ldc, accumulate);
  DotRowsPackedAvx2(a, m, row_at, n, k, c, ldc, accumulate);
}

// Columns [j0, j1) of a non-F32 `w`: one row of a dots the weights as
// they are converted in registers; more rows share each block's converted
// tiles. Each output is the dot over Dequantize's values.
template <class Row>
DUET_AVX2 void DotRowsConvertedAvx2(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1,
                                    float* c, int64_t ldc, bool accumulate) {
  const auto row_at = [&w, j0](int64_t j) { return RowOf<Row>(w, j0 + j); };
  if (m == 1) return DotRowAvx2(a, row_at, j1 - j0, w.k, w.RowBytes(), c, accumulate);
  if (StreamsRows(m, w.k)) return DotRowsStreamAvx2(a, m, row_at, j1 - j0, w.k, w.RowBytes(), c, ldc, accumulate);
  DotRowsPackedAvx2(a, m, row_at, j1 - j0, w.k, c, ldc, accumulate);
}

// The AVX-512 twins of the F32 tiles, the one-row GEMV and the converted
// rows above: an accumulator's lanes 0-7 are the AVX2 code's s0 and 8-15
// its s1, split for the shared FinishDot, so each output is the same bits.
DUET_AVX512 inline float Finish512(__m512 s, const float* a, const float* b, int64_t i, int64_t n) {
  const __m256 s0 = _mm512_castps512_ps256(s);
  const __m256 s1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
  return FinishDot(s0, s1, a, b, i, n);
}

DUET_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
  return Finish512(s, a, b, i, n);
}

template <int R, int C, bool kPrefetch = false>
DUET_AVX512 inline void DotTileAvx512(const float* a, const float* w, int64_t k, float* c, int64_t ldc,
                                      bool accumulate, const PassPrefetch& pf = {}) {
  __m512 s[R][C];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) s[r][j] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if constexpr (kPrefetch) pf.At(i / 16);
    __m512 wv[C];
    for (int j = 0; j < C; ++j) {
      wv[j] = _mm512_loadu_ps(w + j * k + i);
      // Held in a register below 4 rows: left to itself, g++ folds the
      // load into each row's multiply-add (C x R loads a step, not C),
      // which halved the speed of 2- and 3-row tiles (at 4 rows it keeps
      // the registers, and the barrier cost 5%).
      if constexpr (R < 4) asm("" : "+v"(wv[j]));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_loadu_ps(a + r * k + i);
      for (int j = 0; j < C; ++j) s[r][j] = _mm512_fmadd_ps(av, wv[j], s[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) {
      const float d = Finish512(s[r][j], a + r * k, w + j * k, i, k);
      float& out = c[r * ldc + j];
      out = accumulate ? out + d : d;
    }
  }
}

template <int R>
DUET_AVX512 inline void DotTileColsAvx512(const float* a, const float* w, int64_t cols, int64_t k, float* c,
                                          int64_t ldc, bool accumulate) {
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) DotTileAvx512<R, 4>(a, w + j * k, k, c + j, ldc, accumulate);
  for (; j < cols; ++j) DotTileAvx512<R, 1>(a, w + j * k, k, c + j, ldc, accumulate);
}

// DotRowsStreamAvx2's streaming on 16 lanes: tiles of 4 weight rows (a
// non-F32 dtype's widened into L1), each row of a one register per output.
template <class RowAt>
DUET_AVX512 void DotRowsStreamAvx512(const float* a, int64_t m, const RowAt& row_at, int64_t n, int64_t k,
                                     int64_t row_bytes, float* c, int64_t ldc, bool accumulate) {
  constexpr int C = 4;
  using Row = decltype(row_at(0));
  thread_local std::vector<float> widened;
  if constexpr (!std::is_same_v<Row, F32Row>) widened.resize(static_cast<size_t>(C * k));
  for (int64_t j = 0; j < n; j += C) {
    const int cols = static_cast<int>(std::min<int64_t>(C, n - j));
    const Row first = row_at(j);
    const float* tile;
    if constexpr (std::is_same_v<Row, F32Row>) {
      tile = first.p;
    } else {
      for (int t = 0; t < cols; ++t) WidenAvx512(row_at(j + t), k, widened.data() + t * k);
      tile = widened.data();
    }
    PassPrefetch pf = StreamPrefetch(first.Addr(0), row_bytes, C * row_bytes, (m + 3) / 4, k);
    for (int64_t i = 0; i < m; i += 4, pf = pf.Next(k / 16)) {
      const float* ai = a + i * k;
      float* ci = c + i * ldc + j;
      const int64_t r = std::min<int64_t>(4, m - i);
      if (cols == C) {
        if (r == 4) DotTileAvx512<4, C, true>(ai, tile, k, ci, ldc, accumulate, pf);
        if (r == 3) DotTileAvx512<3, C, true>(ai, tile, k, ci, ldc, accumulate, pf);
        if (r == 2) DotTileAvx512<2, C, true>(ai, tile, k, ci, ldc, accumulate, pf);
        if (r == 1) DotTileAvx512<1, C, true>(ai, tile, k, ci, ldc, accumulate, pf);
      } else {
        for (int t = 0; t < cols; ++t) {
          if (r == 4) DotTileAvx512<4, 1>(ai, tile + t * k, k, ci + t, ldc, accumulate);
          if (r == 3) DotTileAvx512<3, 1>(ai, tile + t * k, k, ci + t, ldc, accumulate);
          if (r == 2) DotTileAvx512<2, 1>(ai, tile + t * k, k, ci + t, ldc, accumulate);
          if (r == 1) DotTileAvx512<1, 1>(ai, tile + t * k, k, ci + t, ldc, accumulate);
        }
      }
    }
  }
}

DUET_AVX512 void DotRowsAvx512(const float* a, int64_t m, const float* w, int64_t n, int64_t k, float* c,
                               int64_t ldc, bool accumulate) {
  const int64_t block = L2Rows(k, 4);
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t cols = std::min(block, n - j0);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) DotTileColsAvx512<4>(a + i * k, w + j0 * k, cols, k, c + i * ldc + j0, ldc, accumulate);
    const float* ai = a + i * k;
    float* ci = c + i * ldc + j0;
    if (m - i == 3) DotTileColsAvx512<3>(ai, w + j0 * k, cols, k, ci, ldc, accumulate);
    if (m - i == 2) DotTileColsAvx512<2>(ai, w + j0 * k, cols, k, ci, ldc, accumulate);
    if (m - i == 1) DotTileColsAvx512<1>(ai, w + j0 * k, cols, k, ci, ldc, accumulate);
  }
}

// AxpyRows for d = 16 x D: R output rows held in registers across the run
// of x rows.
template <int R, int D>
DUET_AVX512 inline void AxpyTileAvx512(const float* a, int64_t lda, const float* x, int64_t n, float* y,
                                       int64_t ldy) {
  __m512 acc[R][D];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < D; ++t) acc[r][t] = _mm512_loadu_ps(y + r * ldy + 16 * t);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 xv[D];
    for (int t = 0; t < D; ++t) xv[t] = _mm512_loadu_ps(x + j * 16 * D + 16 * t);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + j]);
      for (int t = 0; t < D; ++t) acc[r][t] = _mm512_fmadd_ps(av, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < D; ++t) _mm512_storeu_ps(y + r * ldy + 16 * t, acc[r][t]);
  }
}

template <int D>
DUET_AVX512 void AxpyRowsAvx512(const float* a, int64_t lda, int64_t m, const float* x, int64_t n, float* y,
                                int64_t ldy) {
  constexpr int R = D <= 4 ? 4 : 2;  // R x D + D of the 32 registers.
  int64_t r = 0;
  for (; r + R <= m; r += R) AxpyTileAvx512<R, D>(a + r * lda, lda, x, n, y + r * ldy, ldy);
  for (; r < m; ++r) AxpyTileAvx512<1, D>(a + r * lda, lda, x, n, y + r * ldy, ldy);
}

// The AVX2 twin, for D x 8 columns at offset 0 of rows ldx apart (a wider
// d runs in column slices).
template <int R, int D>
DUET_AVX2 inline void AxpyTileAvx2(const float* a, int64_t lda, const float* x, int64_t ldx, int64_t n, float* y,
                                   int64_t ldy) {
  __m256 acc[R][D];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < D; ++t) acc[r][t] = _mm256_loadu_ps(y + r * ldy + 8 * t);
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + j);
      for (int t = 0; t < D; ++t) acc[r][t] = _mm256_fmadd_ps(av, _mm256_loadu_ps(x + j * ldx + 8 * t), acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < D; ++t) _mm256_storeu_ps(y + r * ldy + 8 * t, acc[r][t]);
  }
}

template <int D>
DUET_AVX2 void AxpyRowsAvx2(const float* a, int64_t lda, int64_t m, const float* x, int64_t ldx, int64_t n, float* y,
                            int64_t ldy) {
  constexpr int R = D <= 4 ? 2 : 1;  // R x D accumulators (+ D loads) of the 16 registers.
  int64_t r = 0;
  for (; r + R <= m; r += R) AxpyTileAvx2<R, D>(a + r * lda, lda, x, ldx, n, y + r * ldy, ldy);
  for (; r < m; ++r) AxpyTileAvx2<1, D>(a + r * lda, lda, x, ldx, n, y + r * ldy, ldy);
}

template <class Row>
DUET_AVX512 void WidenAvx512(const Row& row, int64_t k, float* o) {
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) _mm512_storeu_ps(o + i, row.Load512(i));
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(o + i, row.Load8(i));
  for (; i < k; ++i) o[i] = row.At(i);
}

template <int C, class Row>
DUET_AVX512 inline void DotTileRowsAvx512(const float* a, const Row* rows, int64_t k, float* c, bool accumulate, int64_t ahead) {
  __m512 s[C];
  for (int j = 0; j < C; ++j) s[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 a0 = _mm512_loadu_ps(a + i), a1 = _mm512_loadu_ps(a + i + 16);
    for (int j = 0; j < C; ++j) {
      _mm_prefetch(rows[j].Addr(i) + ahead, _MM_HINT_T0);
      __m512 w0, w1;
      rows[j].Load32(i, w0, w1);
      s[j] = _mm512_fmadd_ps(a0, w0, s[j]);
      s[j] = _mm512_fmadd_ps(a1, w1, s[j]);
    }
  }
  for (; i + 16 <= k; i += 16) {
    const __m512 av = _mm512_loadu_ps(a + i);
    for (int j = 0; j < C; ++j) s[j] = _mm512_fmadd_ps(av, rows[j].Load512(i), s[j]);
  }
  for (int j = 0; j < C; ++j) {
    float tail[16] = {};
    for (int64_t t = i; t < k; ++t) tail[t - i] = rows[j].At(t);
    const float d = Finish512(s[j], a + i, tail, 0, k - i);
    c[j] = accumulate ? c[j] + d : d;
  }
}

template <class RowAt>
DUET_AVX512 void DotRowAvx512(const float* a, const RowAt& row_at, int64_t n, int64_t k, int64_t row_bytes, float* c,
                             bool accumulate) {
  const int64_t ahead = PrefetchAhead(row_bytes);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const decltype(row_at(0)) rows[4] = {row_at(j), row_at(j + 1), row_at(j + 2), row_at(j + 3)};
    DotTileRowsAvx512<4>(a, rows, k, c + j, accumulate, ahead);
  }
  for (; j < n; ++j) {
    const auto row = row_at(j);
    DotTileRowsAvx512<1>(a, &row, k, c + j, accumulate, ahead);
  }
}

template <class Row>
DUET_AVX512 void DotRowsConvertedAvx512(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1,
                                        float* c, int64_t ldc, bool accumulate) {
  const int64_t k = w.k, n = j1 - j0;
  const auto row_at = [&w, j0](int64_t j) { return RowOf<Row>(w, j0 + j); };
  if (m == 1) return DotRowAvx512(a, row_at, n, k, w.RowBytes(), c, accumulate);
  if (StreamsRows(m, k)) return DotRowsStreamAvx512(a, m, row_at, n, k, w.RowBytes(), c, ldc, accumulate);
  const int64_t block = L2Rows(k, 4);
  thread_local std::vector<float> floats;
  floats.resize(static_cast<size_t>(std::min(block, n) * k));
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t cols = std::min(block, n - b0);
    for (int64_t r = 0; r < cols; ++r) WidenAvx512(RowOf<Row>(w, j0 + b0 + r), k, floats.data() + r * k);
    DotRowsAvx512(a, m, floats.data(), cols, k, c + b0, ldc, accumulate);
  }
}

// The converted rows on the widest vectors the CPU has.
template <class Row>
void DotRowsConverted(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c,
                      int64_t ldc, bool accumulate) {
  if (UseAvx512()) return DotRowsConvertedAvx512<Row>(a, m, w, j0, j1, c, ldc, accumulate);
  DotRowsConvertedAvx2<Row>(a, m, w, j0, j1, c, ldc, accumulate);
}

DUET_AVX2 void AxpyAvx2(float a, const float* x, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

DUET_AVX2 void ScaleMulAvx2(const float* x, float scale, const float* w, float* y, int64_t n) {
  __m256 vs = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                          _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

DUET_AVX2 float SumSquaresAvx2(const float* x, int64_t n) {
  __m256 s = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    s = _mm256_fmadd_ps(v, v, s);
  }
  float r = HSum(s);
  for (; i < n; ++i) r += x[i] * x[i];
  return r;
}

DUET_AVX2 float ExpShiftSumAvx2(float* x, float shift, int64_t n) {
  __m256 vs = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float r = HSum(acc);
  for (; i < n; ++i) r += (x[i] = std::exp(x[i] - shift));
  return r;
}

DUET_AVX2 float MaxAvx2(const float* x, int64_t n) {
  int64_t i = 0;
  float r = -INFINITY;
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    r = HMax(m);
  }
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

DUET_AVX2 void ScaleAvx2(float* x, float s, int64_t n) {
  __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  for (; i < n; ++i) x[i] *= s;
}

// GELU's tanh form as a sigmoid: 0.5 x (1 + tanh(y)) = x / (1 + exp(-2 y)),
// y = sqrt(2 / pi) (x + 0.044715 x^3).
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;
inline float GeluTanh(float x) { return x / (1.0f + std::exp(-2.0f * kGeluC * (x + kGeluA * x * x * x))); }

DUET_AVX2 void GeluTanhMulAvx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 m2c = _mm256_set1_ps(-2.0f * kGeluC);
  const __m256 a = _mm256_set1_ps(kGeluA);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 z = _mm256_mul_ps(m2c, _mm256_add_ps(x, _mm256_mul_ps(a, x3)));
    const __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(one, Exp256(z)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = GeluTanh(g[i]) * u[i];
}

DUET_AVX2 void SiluMulAvx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 e = Exp256(_mm256_sub_ps(zero, gv));
    __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

DUET_AVX2 void AddAvx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

// Integer dots on quantized activations (DotRowsInt8).

// x[e] * inv rounded to nearest even (the default rounding, as nearbyint),
// as int8 at out[e], eight at a time from e0; returns where it stopped.
// |x| <= max |x| keeps every value within [-127, 127].
DUET_AVX2 int64_t QuantizeRunAvx2(const float* x, int64_t e0, int64_t e1, float inv, int8_t* out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  int64_t e = e0;
  for (; e + 8 <= e1; e += 8) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + e), vinv));
    const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + e), _mm_packs_epi16(h, h));
  }
  return e;
}

// Row r of a (k floats) as blocks of 32 int8 (q + r * blocks * 32, zero
// past k) and their scales (d + r * blocks); with s8, also each block's
// eight lanes' sums (elements 4l .. 4l + 3) times 8 (s8 + r * blocks * 8),
// which the Q4 tiles subtract (below).
void QuantizeRowInt8(const float* x, int64_t k, int8_t* q, float* d, int32_t* s8) {
  const int64_t blocks = QuantBlocks(k);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t e0 = b * kQuantBlock, e1 = std::min(k, e0 + kQuantBlock);
    float amax = 0;
    for (int64_t e = e0; e < e1; ++e) amax = std::max(amax, std::fabs(x[e]));
    const float scale = amax / 127.0f;
    const float inv = scale == 0 ? 0 : 1.0f / scale;
    d[b] = scale;
    int8_t* out = q + e0;
    int64_t e = e0;
    if (UseAvx2()) e = QuantizeRunAvx2(x, e0, e1, inv, out - e0);
    for (; e < e1; ++e) out[e - e0] = static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint(x[e] * inv)), -127, 127));
    for (e = e1; e < e0 + kQuantBlock; ++e) out[e - e0] = 0;
    if (s8 == nullptr) continue;
    for (int l = 0; l < 8; ++l) {
      s8[b * 8 + l] = 8 * (out[4 * l] + out[4 * l + 1] + out[4 * l + 2] + out[4 * l + 3]);
    }
  }
}

// Lanes summed in HSum's order: ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)).
float HSumScalar(const float* v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// Quantized rows of activations: row r's blocks at q + r * blocks * 32,
// their scales at d + r * blocks, and (Q4) their lane sums x 8 at s8 + r *
// blocks * 8.
struct Int8Acts {
  const int8_t* q;
  const float* d;
  const int32_t* s8;
  int64_t blocks;
};

// R rows of activations against C weight rows, one 8-lane accumulator per
// output. Each lane's block product P is exact in int32 (vpmaddubsw pairs,
// at most 2 x 127 x 128, then vpmaddwd fours), two ways:
//   signed weights (Q8, Q4Z's q - zero): |x| times w with x's sign;
//   kNibbles (Q4): the nibbles q (0..15) times x as they are, less 8 x the
//   lane's sum of x, which is the sum of (q - 8) x, with no per-row sign
//   or subtraction of the zero.
template <int R, int C, bool kNibbles, class Row>
DUET_AVX2 inline void Int8TileAvx2(const Int8Acts& a, const Row* rows, float* c, int64_t ldc, bool accumulate,
                                   int64_t ahead) {
  constexpr int64_t kPerLine = 64 / Row::kBlockBytes;  // blocks per cache line of a weight row
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.blocks; ++b) {
    if (b % kPerLine == 0) {
      for (int j = 0; j < C; ++j) _mm_prefetch(rows[j].Addr(b * kQuantBlock) + ahead, _MM_HINT_T0);
    }
    __m256i wq[C];
    __m256 ws[C];
    for (int j = 0; j < C; ++j) {
      if constexpr (kNibbles) {
        wq[j] = rows[j].LoadNibbles(b);
      } else {
        wq[j] = rows[j].LoadInt8(b);
      }
      ws[j] = _mm256_broadcast_ss(rows[j].scales + b);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (r * a.blocks + b) * kQuantBlock));
      const __m256 dx = _mm256_broadcast_ss(a.d + r * a.blocks + b);
      __m256i p[C];
      if constexpr (kNibbles) {
        const __m256i s8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s8 + (r * a.blocks + b) * 8));
        for (int j = 0; j < C; ++j) {
          p[j] = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[j], x), ones), s8);
        }
      } else {
        const __m256i ax = _mm256_sign_epi8(x, x);
        for (int j = 0; j < C; ++j) {
          p[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wq[j], x)), ones);
        }
      }
      for (int j = 0; j < C; ++j) {
        acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[j]), _mm256_mul_ps(dx, ws[j]), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < C; ++j) {
      const float v = HSum(acc[r][j]);
      float& out = c[r * ldc + j];
      out = accumulate ? out + v : v;
    }
  }
}

template <int R, bool kNibbles, class Row>
DUET_AVX2 void Int8RowsAvx2(const Int8Acts& a, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
                            bool accumulate) {
  constexpr int C = R == 1 ? 4 : 2;
  const int64_t ahead = PrefetchAhead(w.RowBytes());
  int64_t j = j0;
  for (; j + C <= j1; j += C) {
    Row rows[C];
    for (int t = 0; t < C; ++t) rows[t] = RowOf<Row>(w, j + t);
    Int8TileAvx2<R, C, kNibbles>(a, rows, c + (j - j0), ldc, accumulate, ahead);
  }
  for (; j < j1; ++j) {
    const Row row = RowOf<Row>(w, j);
    Int8TileAvx2<R, 1, kNibbles>(a, &row, c + (j - j0), ldc, accumulate, ahead);
  }
}

template <bool kNibbles, class Row>
DUET_AVX2 void DotRowsInt8Avx2(const Int8Acts& a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c,
                               int64_t ldc, bool accumulate) {
  // Blocks of weight rows in L2 while every group of rows passes over them.
  const int64_t block = std::max<int64_t>(4, (int64_t{256} << 10) / std::max<int64_t>(1, w.RowBytes()));
  for (int64_t b0 = j0; b0 < j1; b0 += block) {
    const int64_t b1 = std::min(j1, b0 + block);
    int64_t i = 0;
    const auto rows = [&](auto tile, int64_t i) {
      constexpr int R = decltype(tile)::value;
      const Int8Acts ai{a.q + i * a.blocks * kQuantBlock, a.d + i * a.blocks,
                        a.s8 != nullptr ? a.s8 + i * a.blocks * 8 : nullptr, a.blocks};
      Int8RowsAvx2<R, kNibbles, Row>(ai, w, b0, b1, c + i * ldc + (b0 - j0), ldc, accumulate);
    };
    for (; i + 4 <= m; i += 4) rows(std::integral_constant<int, 4>{}, i);
    if (m - i == 3) rows(std::integral_constant<int, 3>{}, i);
    if (m - i == 2) rows(std::integral_constant<int, 2>{}, i);
    if (m - i == 1) rows(std::integral_constant<int, 1>{}, i);
  }
}

// The same sums without vectors: each block's lane sums exactly, the same
// fused multiply-adds per lane, the same lane sum.
template <class Row>
void DotRowsInt8Scalar(const int8_t* qa, const float* da, int64_t m, int64_t blocks, const WeightMatrix& w, int64_t j0,
                       int64_t j1, float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = j0; j < j1; ++j) {
    const Row row = RowOf<Row>(w, j);
    for (int64_t i = 0; i < m; ++i) {
      float acc[8] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* x = qa + (i * blocks + b) * kQuantBlock;
        const float scale = da[i * blocks + b] * row.scales[b];
        for (int l = 0; l < 8; ++l) {
          int p = 0;
          for (int t = 4 * l; t < 4 * l + 4; ++t) p += x[t] * row.Int(b * kQuantBlock + t);
          acc[l] = std::fma(static_cast<float>(p), scale, acc[l]);
        }
      }
      const float v = HSumScalar(acc);
      float& out = c[i * ldc + (j - j0)];
      out = accumulate ? out + v : v;
    }
  }
}

template <class Row>
void DotRowsInt8Of(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
                   bool accumulate) {
  const int64_t blocks = QuantBlocks(w.k);
  // Q4 without zero points takes its nibbles unsigned (Int8TileAvx2).
  const bool nibbles = UseAvx2() && w.dtype == DType::kQ4;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  thread_local std::vector<int32_t> s8;
  q.resize(static_cast<size_t>(m * blocks * kQuantBlock));
  d.resize(static_cast<size_t>(m * blocks));
  s8.resize(nibbles ? static_cast<size_t>(m * blocks * 8) : 0);
  for (int64_t i = 0; i < m; ++i) {
    QuantizeRowInt8(a + i * w.k, w.k, q.data() + i * blocks * kQuantBlock, d.data() + i * blocks,
                    nibbles ? s8.data() + i * blocks * 8 : nullptr);
  }
  const Int8Acts acts{q.data(), d.data(), nibbles ? s8.data() : nullptr, blocks};
  if constexpr (std::is_same_v<Row, Q4Row>) {
    if (nibbles) return DotRowsInt8Avx2<true, Row>(acts, m, w, j0, j1, c, ldc, accumulate);
  }
  if (UseAvx2()) return DotRowsInt8Avx2<false, Row>(acts, m, w, j0, j1, c, ldc, accumulate);
  DotRowsInt8Scalar<Row>(q.data(), d.data(), m, blocks, w, j0, j1, c, ldc, accumulate);
}

}  // namespace

bool UseAvx2() {
  static const bool use = DetectAvx2();
  return use;
}

namespace {
std::atomic<bool>& Avx512() {
  static std::atomic<bool> use{UseAvx2() && DetectAvx512()};
  return use;
}
}  // namespace

bool UseAvx512() { return Avx512().load(std::memory_order_relaxed); }

void SetAvx512ForTesting(bool on) { Avx512().store(on && UseAvx2() && DetectAvx512()); }

float Dot(const float* a, const float* b, int64_t n) {
  if (UseAvx512()) return DotAvx512(a, b, n);
  if (UseAvx2()) return DotAvx2(a, b, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void DotRows(const float* a, int64_t m, const float* w, int64_t n, int64_t k, float* c, int64_t ldc,
             bool accumulate) {
  if (UseAvx512()) {
    // One row: the GEMV's prefetching tiles.
    const auto row_at = [w, k](int64_t j) { return F32Row{w + j * k}; };
    if (m == 1) return DotRowAvx512(a, row_at, n, k, 4 * k, c, accumulate);
    if (StreamsRows(m, k)) return DotRowsStreamAvx512(a, m, row_at, n, k, 4 * k, c, ldc, accumulate);
    return DotRowsAvx512(a, m, w, n, k, c, ldc, accumulate);
  }
  if (UseAvx2()) return DotRowsAvx2(a, m, w, n, k, c, ldc, accumulate);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float d = Dot(a + i * k, w + j * k, k);
      float& out = c[i * ldc + j];
      out = accumulate ? out + d : d;
    }
  }
}

void Widen(const void* src, DType dtype, int64_t n, float* out) {
  const auto* h = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DType::kBF16:
      if (UseAvx512()) return WidenAvx512(Bf16Row{h}, n, out);
      if (UseAvx2()) return WidenAvx2(Bf16Row{h}, n, out);
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(h[i]);
      return;
    case DType::kF16:
      if (UseAvx512()) return WidenAvx512(F16Row{h}, n, out);
      if (UseAvx2()) return WidenAvx2(F16Row{h}, n, out);
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(h[i]);
      return;
    default:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
  }
}

void DotRowsW(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
              bool accumulate) {
  if (UseAvx2()) {
    switch (w.dtype) {
      case DType::kF32:
        return DotRows(a, m, static_cast<const float*>(w.values) + j0 * w.k, j1 - j0, w.k, c, ldc, accumulate);
      case DType::kBF16: return DotRowsConverted<Bf16Row>(a, m, w, j0, j1, c, ldc, accumulate);
      case DType::kF16: return DotRowsConverted<F16Row>(a, m, w, j0, j1, c, ldc, accumulate);
      case DType::kQ8: return DotRowsConverted<Q8Row>(a, m, w, j0, j1, c, ldc, accumulate);
      case DType::kQ4:
      case DType::kQ4Z: return DotRowsConverted<Q4Row>(a, m, w, j0, j1, c, ldc, accumulate);
    }
  }
  std::vector<float> row(w.k);
  for (int64_t j = j0; j < j1; ++j) {
    DequantizeRow(w, j, row.data());
    for (int64_t i = 0; i < m; ++i) {
      const float d = Dot(a + i * w.k, row.data(), w.k);
      float& out = c[i * ldc + (j - j0)];
      out = accumulate ? out + d : d;
    }
  }
}

void DotRowsInt8(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
                 bool accumulate) {
  switch (w.dtype) {
    case DType::kQ8: return DotRowsInt8Of<Q8Row>(a, m, w, j0, j1, c, ldc, accumulate);
    case DType::kQ4:
    case DType::kQ4Z: return DotRowsInt8Of<Q4Row>(a, m, w, j0, j1, c, ldc, accumulate);
    default: return DotRowsW(a, m, w, j0, j1, c, ldc, accumulate);
  }
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  if (UseAvx2()) return AxpyAvx2(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void AxpyRows(const float* a, int64_t lda, int64_t m, const float* x, int64_t n, int64_t d, float* y, int64_t ldy) {
  // Fused multiply-adds of any width in registers give each element the
  // bits of Axpy's AVX2 ones; a width neither tiles is Axpy itself.
  if (UseAvx512() && d % 16 == 0 && d <= 128) {
    switch (d / 16) {
      case 1: return AxpyRowsAvx512<1>(a, lda, m, x, n, y, ldy);
      case 2: return AxpyRowsAvx512<2>(a, lda, m, x, n, y, ldy);
      case 3: return AxpyRowsAvx512<3>(a, lda, m, x, n, y, ldy);
      case 4: return AxpyRowsAvx512<4>(a, lda, m, x, n, y, ldy);
      case 5: return AxpyRowsAvx512<5>(a, lda, m, x, n, y, ldy);
      case 6: return AxpyRowsAvx512<6>(a, lda, m, x, n, y, ldy);
      case 7: return AxpyRowsAvx512<7>(a, lda, m, x, n, y, ldy);
      default: return AxpyRowsAvx512<8>(a, lda, m, x, n, y, ldy);
    }
  }
  if (UseAvx2() && d % 8 == 0) {
    for (int64_t c0 = 0; c0 < d; c0 += 64) {
      const float* xc = x + c0;
      float* yc = y + c0;
      switch (std::min<int64_t>(64, d - c0) / 8) {
        case 1: AxpyRowsAvx2<1>(a, lda, m, xc, d, n, yc, ldy); break;
        case 2: AxpyRowsAvx2<2>(a, lda, m, xc, d, n, yc, ldy); break;
        case 3: AxpyRowsAvx2<3>(a, lda, m, xc, d, n, yc, ldy); break;
        case 4: AxpyRowsAvx2<4>(a, lda, m, xc, d, n, yc, ldy); break;
        case 5: AxpyRowsAvx2<5>(a, lda, m, xc, d, n, yc, ldy); break;
        case 6: AxpyRowsAvx2<6>(a, lda, m, xc, d, n, yc, ldy); break;
        case 7: AxpyRowsAvx2<7>(a, lda, m, xc, d, n, yc, ldy); break;
        default: AxpyRowsAvx2<8>(a, lda, m, xc, d, n, yc, ldy); break;
      }
    }
    return;
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) Axpy(a[r * lda + j], x + j * d, y + r * ldy, d);
  }
}

void ScaleMul(const float* x, float scale, const float* w, float* y, int64_t n) {
  if (UseAvx2()) return ScaleMulAvx2(x, scale, w, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

float SumSquares(const float* x, int64_t n) {
  if (UseAvx2()) return SumSquaresAvx2(x, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

float ExpShiftSum(float* x, float shift, int64_t n) {
  if (UseAvx2()) return ExpShiftSumAvx2(x, shift, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = std::exp(x[i] - shift));
  return s;
}

float Max(const float* x, int64_t n) {
  if (UseAvx2()) return MaxAvx2(x, n);
  float r = -INFINITY;
  for (int64_t i = 0; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

void Scale(float* x, float s, int64_t n) {
  if (UseAvx2()) return ScaleAvx2(x, s, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void SiluMul(const float* g, const float* u, float* out, int64_t n) {
  if (UseAvx2()) return SiluMulAvx2(g, u, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void GeluTanhMul(const float* g, const float* u, float* out, int64_t n) {
  if (UseAvx2()) return GeluTanhMulAvx2(g, u, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(g[i]) * u[i];
}

void Add(const float* x, float* y, int64_t n) {
  if (UseAvx2()) return AddAvx2(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace duet::kernels::simd

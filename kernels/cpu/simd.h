// Vector primitives for the CPU backend: AVX2/FMA where the CPU has them,
// scalar loops otherwise, chosen at run time so one binary runs anywhere.
//
//   float d = simd::Dot(q, k, head_dim);
//   simd::Axpy(w, v, acc, head_dim);  // acc += w * v
//
// Results may differ from the scalar loops in the last bits (FMA, summation
// order); callers compare against kernels/cpu/reference.h by normalized error.
#ifndef DUET_KERNELS_CPU_SIMD_H_
#define DUET_KERNELS_CPU_SIMD_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace duet::kernels::simd {

// True when the CPU has AVX2, FMA and F16C (checked once). DUET_NO_AVX2=1 in the
// environment forces the scalar paths, to test them on any machine.
bool UseAvx2();
// True when the CPU also has AVX-512 F/BW/DQ/VL (checked once): the dots
// then run on 16 lanes, the same bits as the AVX2 paths give.
// DUET_NO_AVX512=1 in the environment forces the AVX2 paths.
bool UseAvx512();
// For tests: off runs the AVX2 paths in this process even where AVX-512 is
// present; on goes back to what the CPU has.
void SetAvx512ForTesting(bool on);

float Dot(const float* a, const float* b, int64_t n);
// c[i * ldc + j] = (c[i * ldc + j] +) Dot(a + i * k, w + j * k, k) for
// i < m, j < n: each the same bits as that Dot, whatever m and n are (the
// batch-invariant GEMM), computed in register tiles.
void DotRows(const float* a, int64_t m, const float* w, int64_t n, int64_t k, float* c, int64_t ldc,
             bool accumulate);
// DotRows over columns [j0, j1) of a weight matrix in any dtype: c[i *
// ldc + (j - j0)] gets row i of a dotted with row j, the bits DotRows gives
// on Dequantize(w)'s rows (no dequantized copy of the matrix is made: one
// row of a dots the weights as they are converted in registers; more rows
// share a block of converted rows in an L2-sized scratch).
void DotRowsW(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
              bool accumulate);
// DotRowsW for a Q8, Q4 or Q4Z `w` with integer dot products (the CPU
// backend's CpuKernels::kInt8Activations): each row of a is quantized to
// int8 in blocks of 32 along k (scale d = max |x| / 127 per block, q =
// x / d rounded to nearest even), and output (i, j) is
//   sum over blocks b of float(P_b) x (d_ib x s_jb),
// P_b the exact integer dot of the block's int8 activations with the
// weights' integers (q - zero), accumulated in 8 float lanes (lane l takes
// each block's elements 4l .. 4l + 3, one fused multiply-add per block) and
// the lanes summed as Dot sums them. A row's quantization depends on that
// row alone, so every output keeps its bits whatever m is, and the same
// code runs with AVX-512, so both give the same bits (the scalar path too).
void DotRowsInt8(const float* a, int64_t m, const WeightMatrix& w, int64_t j0, int64_t j1, float* c, int64_t ldc,
                 bool accumulate);
// out[i] = src[i] as a float, src of dtype f32, bf16 or f16 (exact).
void Widen(const void* src, DType dtype, int64_t n, float* out);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);
// For r < m: y + r * ldy += a[r * lda + j] * (x + j * d) for j = 0 .. n-1,
// in order: each row the bits of those n Axpy calls, whatever m is (each
// element one fused multiply-add per j). A zero a[r * lda + j] adds
// nothing, so rows may share a run of j with their unused weights zeroed.
void AxpyRows(const float* a, int64_t lda, int64_t m, const float* x, int64_t n, int64_t d, float* y, int64_t ldy);
// y = x * scale * w (element-wise w).
void ScaleMul(const float* x, float scale, const float* w, float* y, int64_t n);
float SumSquares(const float* x, int64_t n);
// x[i] = exp(x[i] - shift); returns the sum.
float ExpShiftSum(float* x, float shift, int64_t n);
float Max(const float* x, int64_t n);
void Scale(float* x, float s, int64_t n);
// out[i] = silu(g[i]) * u[i]
void SiluMul(const float* g, const float* u, float* out, int64_t n);
// out = gelu_tanh(g) * u (GELU's tanh approximation, as Gemma's MLP).
void GeluTanhMul(const float* g, const float* u, float* out, int64_t n);
void Add(const float* x, float* y, int64_t n);  // y += x

}  // namespace duet::kernels::simd

#endif  // DUET_KERNELS_CPU_SIMD_H_

// The CPU kernel backend: hand-vectorised (AVX2/FMA) ops threaded over
// duet's own pool.
//
// Batch invariance (the default, CpuKernels::kBatchInvariant): every row of
// every op is computed the same way whatever else is in the call, so a
// request's tokens depend only on its prompt, parameters and seed, never on
// what it is batched with, how its prompt is chunked or whether its prefix
// came from the cache. GEMMs are register-tiled dot products
// (simd::DotRows), each output the bits simd::Dot gives; attention takes the
// row path for every query row. CpuKernels::kFastest (benchmarks only) is
// the earlier mix: OpenBLAS GEMV for one row, dots up to kFewRows rows,
// OpenBLAS GEMM above, and GEMM tiles for prefill attention, whose rounding
// depends on how many rows share the call.
//
//   KernelBackendPtr be = NewCpuBackend(/*threads=*/2);
//   be->Gemm(x, weights.view(), nullptr, y, tokens, /*accumulate=*/false);
//
// Thread budget: the backend owns a ThreadPool of `threads` and sets OpenBLAS
// to one thread; GEMMs are split by output columns across the pool, each slice
// one single-threaded call. So duet and OpenBLAS together use exactly
// `threads` cores, and OpenBLAS's spinning workers never compete with the
// attention and element-wise ops that follow each GEMM.
#ifndef DUET_KERNELS_CPU_CPU_BACKEND_H_
#define DUET_KERNELS_CPU_CPU_BACKEND_H_

#include "kernels/backend.h"

namespace duet::kernels {

// kInt8Activations: kBatchInvariant, except that a GEMM on Q8, Q4 or Q4Z
// weights quantizes each row of activations to int8 (blocks of 32, a scale
// each, that row alone) and takes integer dot products (simd::DotRowsInt8):
// still batch-invariant, and the same bits on AVX2 and AVX-512, but not the
// F32 product over the dequantized weights (kernels/README.md gives its
// quality against F32). Opt-in: it changes outputs.
enum class CpuKernels { kBatchInvariant, kFastest, kInt8Activations };

// threads <= 0 means every core this process may run on.
KernelBackendPtr NewCpuBackend(int threads, CpuKernels kernels = CpuKernels::kBatchInvariant);

// The vector instructions the CPU backend's kernels run on in this process:
// "AVX-512", "AVX2" (also with DUET_NO_AVX512=1) or "scalar" (DUET_NO_AVX2=1
// or a CPU without AVX2/FMA/F16C).
const char* CpuInstructionSet();

}  // namespace duet::kernels

#endif  // DUET_KERNELS_CPU_CPU_BACKEND_H_

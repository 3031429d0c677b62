// The CPU kernel backend: OpenBLAS GEMM, hand-vectorised (AVX2/FMA) ops,
// threaded over duet's own pool.
//
//   KernelBackendPtr be = NewCpuBackend(/*threads=*/2);
//   be->Gemm(x, w, nullptr, y, tokens, out_features, in_features, false);
//
// Thread budget: the backend owns a ThreadPool of `threads` and sets OpenBLAS
// to one thread; GEMMs are split by output columns across the pool, each slice
// a single-threaded OpenBLAS call. So duet and OpenBLAS together use exactly
// `threads` cores, and OpenBLAS's spinning workers never compete with the
// attention and element-wise ops that follow each GEMM.
#ifndef DUET_KERNELS_CPU_CPU_BACKEND_H_
#define DUET_KERNELS_CPU_CPU_BACKEND_H_

#include "kernels/backend.h"

namespace duet::kernels {

// threads <= 0 means every core this process may run on.
KernelBackendPtr NewCpuBackend(int threads);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_CPU_CPU_BACKEND_H_

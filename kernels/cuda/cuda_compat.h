// What a CUDA source of duet's includes for the CUDA runtime and its
// language: under nvcc (and the g++ files of the CUDA build) the CUDA
// headers; in the host build (DUET_SIMT, kernels/simt) the SIMT executor's
// stand-in, so the same .cu runs in CI on the CPU. Two spellings differ from
// plain CUDA and mean it under nvcc:
//   DUET_SHARED(float, partial, 32);                    // __shared__ float partial[32];
//   DUET_LAUNCH(Kernel, grid, block, 0, stream)(args);   // Kernel<<<grid, block, 0, stream>>>(args);
// Nothing else: the header stays free of abseil (nvcc compiles C++17).
#ifndef DUET_KERNELS_CUDA_CUDA_COMPAT_H_
#define DUET_KERNELS_CUDA_CUDA_COMPAT_H_

#if defined(DUET_SIMT)
#include "kernels/simt/simt.h"
#else
#include <cuda_runtime_api.h>
#define DUET_SHARED(T, name, n) __shared__ T name[n]
#define DUET_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<(grid), (block), (shared_bytes), (stream)>>>
#endif

#endif  // DUET_KERNELS_CUDA_CUDA_COMPAT_H_

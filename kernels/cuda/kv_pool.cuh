// The paged KV pool as the CUDA kernels see it: its element type and
// strides (kernels/kv_layout.h's, in elements), filled from a KvLayout by
// the backend, and, for the .cu files, the element offset and widening.
// Free of abseil and of C++20 because nvcc compiles it as C++17.
#ifndef DUET_KERNELS_CUDA_KV_POOL_CUH_
#define DUET_KERNELS_CUDA_KV_POOL_CUH_

#include "kernels/cuda/cuda_compat.h"

#include <cstdint>

namespace duet::kernels::cuda {

struct KvPoolShape {
  enum Element { kF32, kBF16, kF16 } element = kF32;
  int64_t block_size = 0;
  int64_t head_dim = 0;
  int64_t block_stride = 0;
  int64_t layer_stride = 0;
  int64_t kv_stride = 0;  // K to V
  int64_t head_stride = 0;

#if defined(__CUDACC__) || defined(DUET_SIMT)
  // Element offset of (block, layer, K, head, slot)'s row; V's is kv_stride on.
  __device__ int64_t Offset(int64_t block, int64_t layer, int64_t head, int64_t slot) const {
    return block * block_stride + layer * layer_stride + head * head_stride + slot * head_dim;
  }
#endif
};

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_KV_POOL_CUH_

// Storing a batch's new K and V into the paged pool on the GPU: the CUDA
// launcher behind the CUDA backend's KvStore.
//
//   KvPoolShape shape = ...;  // from a kernels::KvLayout (cuda_backend.cc)
//   cudaError_t err = LaunchKvStore(d_k, d_v, d_slots, rows, d_pool, shape, layer, head_begin, heads, stream);
//
// Matches kernels::ref::KvStore: row r's K and V ([rows][heads][head_dim]
// floats) go to slot slots[r] (block * block_size + slot) of layer `layer`,
// heads head_begin .. head_begin + heads - 1, each element rounded once to
// the pool's dtype (to nearest even), as kernels::KvLayout::Store writes it.
// All pointers are device memory. Free of abseil because nvcc compiles it
// as C++17.
#ifndef DUET_KERNELS_CUDA_KV_STORE_CUH_
#define DUET_KERNELS_CUDA_KV_STORE_CUH_

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/kv_pool.cuh"

#include <cstdint>

namespace duet::kernels::cuda {

// Enqueues the op on `stream`; negative sizes give cudaErrorInvalidValue,
// no rows enqueue nothing.
cudaError_t LaunchKvStore(const float* k, const float* v, const int32_t* slots, int64_t rows, void* pool,
                          const KvPoolShape& shape, int64_t layer, int64_t head_begin, int64_t heads,
                          cudaStream_t stream);

}  // namespace duet::kernels::cuda

#endif  // DUET_KERNELS_CUDA_KV_STORE_CUH_

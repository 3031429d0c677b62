#include "kernels/cuda/kv_store.cuh"

#include "kernels/cuda/device.cuh"

namespace duet::kernels::cuda {
namespace {

// One thread per element of the batch's K (and the same one of V), in a
// grid-stride loop: element e is row e / (heads * head_dim), head (e /
// head_dim) % heads, dimension e % head_dim.
template <typename T>
__global__ void KvStoreKernel(const float* __restrict__ k, const float* __restrict__ v,
                              const int32_t* __restrict__ slots, T* __restrict__ pool, KvPoolShape s,
                              int64_t layer, int64_t head_begin, int64_t heads, int64_t n) {
  for (int64_t e = GridFirst(); e < n; e += GridStride()) {
    const int64_t d = e % s.head_dim, rh = e / s.head_dim;
    const int64_t h = rh % heads, r = rh / heads;
    const int64_t slot_id = slots[r];
    if (slot_id < 0) continue;  // a padding row
    const int64_t block = slot_id / s.block_size, slot = slot_id % s.block_size;
    const int64_t at = s.Offset(block, layer, head_begin + h, slot) + d;
    pool[at] = RoundTo<T>(k[e]);
    pool[at + s.kv_stride] = RoundTo<T>(v[e]);
  }
}

template <typename T>
void Launch(const float* k, const float* v, const int32_t* slots, void* pool, const KvPoolShape& s, int64_t layer,
            int64_t head_begin, int64_t heads, int64_t n, cudaStream_t stream) {
  DUET_LAUNCH(KvStoreKernel<T>, BlocksFor(n), kThreads, 0, stream)(k, v, slots, static_cast<T*>(pool), s, layer,
                                                             head_begin, heads, n);
}

}  // namespace

cudaError_t LaunchKvStore(const float* k, const float* v, const int32_t* slots, int64_t rows, void* pool,
                          const KvPoolShape& shape, int64_t layer, int64_t head_begin, int64_t heads,
                          cudaStream_t stream) {
  if (rows < 0 || heads < 0 || head_begin < 0 || layer < 0 || shape.head_dim <= 0 || shape.block_size <= 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = rows * heads * shape.head_dim;
  if (n == 0) return cudaSuccess;
  switch (shape.element) {
    case KvPoolShape::kF32:
      Launch<float>(k, v, slots, pool, shape, layer, head_begin, heads, n, stream);
      break;
    case KvPoolShape::kBF16:
      Launch<__nv_bfloat16>(k, v, slots, pool, shape, layer, head_begin, heads, n, stream);
      break;
    case KvPoolShape::kF16:
      Launch<__half>(k, v, slots, pool, shape, layer, head_begin, heads, n, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace duet::kernels::cuda

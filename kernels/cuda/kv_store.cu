#include "kernels/cuda/kv_store.cuh"

#if !defined(DUET_SIMT)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace duet::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <typename T>
__device__ T Round(float x);
template <>
__device__ float Round<float>(float x) {
  return x;
}
template <>
__device__ __nv_bfloat16 Round<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __half Round<__half>(float x) {
  return __float2half(x);
}

// One thread per element of the batch's K (and the same one of V), in a
// grid-stride loop: element e is row e / (heads * head_dim), head (e /
// head_dim) % heads, dimension e % head_dim.
template <typename T>
__global__ void KvStoreKernel(const float* __restrict__ k, const float* __restrict__ v,
                              const int32_t* __restrict__ slots, T* __restrict__ pool, KvPoolShape s,
                              int64_t layer, int64_t head_begin, int64_t heads, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t d = e % s.head_dim, rh = e / s.head_dim;
    const int64_t h = rh % heads, r = rh / heads;
    const int64_t slot_id = slots[r];
    const int64_t block = slot_id / s.block_size, slot = slot_id % s.block_size;
    const int64_t at = s.Offset(block, layer, head_begin + h, slot) + d;
    pool[at] = Round<T>(k[e]);
    pool[at + s.kv_stride] = Round<T>(v[e]);
  }
}

template <typename T>
void Launch(const float* k, const float* v, const int32_t* slots, void* pool, const KvPoolShape& s, int64_t layer,
            int64_t head_begin, int64_t heads, int64_t n, cudaStream_t stream) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
  DUET_LAUNCH(KvStoreKernel<T>, blocks, kThreads, 0, stream)(k, v, slots, static_cast<T*>(pool), s, layer,
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

// The paged KV cache layout shared by the engine, kernels and kvtransfer.
//
//   KvLayout l{.num_layers = 12, .num_kv_heads = 4, .block_size = 16, .head_dim = 64,
//              .dtype = DType::kBF16};
//   l.Store(pool, l.Offset(block, layer, /*v=*/0, head, slot), k_row, l.head_dim);
//
// A pool is `[block][layer][K|V][kv_head][slot][head_dim]`, block-major, so one
// block is one contiguous region and one layer's slice of a block (or one head
// range of it) is a contiguous sub-region: what a KV transfer moves. Its
// elements are f32, bf16 or f16 (`dtype`): K and V are computed in float and
// rounded to nearest even once, as they are written; readers widen them back
// exactly. Offsets are in elements; ElementBytes() turns them into bytes.
#ifndef DUET_KERNELS_KV_LAYOUT_H_
#define DUET_KERNELS_KV_LAYOUT_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace duet::kernels {

// The dtypes a KV pool can hold: f32, bf16 and f16.
bool IsKvDType(DType d);

struct KvLayout {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t block_size = 16;
  int64_t head_dim = 0;
  DType dtype = DType::kF32;

  int64_t SlotStride() const { return head_dim; }
  int64_t HeadStride() const { return block_size * head_dim; }
  int64_t KvStride() const { return num_kv_heads * HeadStride(); }
  int64_t LayerStride() const { return 2 * KvStride(); }
  int64_t BlockStride() const { return num_layers * LayerStride(); }
  int64_t ElementBytes() const { return dtype == DType::kF32 ? 4 : 2; }
  int64_t BlockBytes() const { return BlockStride() * ElementBytes(); }
  // Offset, in elements, of one (block, layer, K=0/V=1, head, slot) row.
  int64_t Offset(int64_t block, int64_t layer, int64_t kv, int64_t head, int64_t slot) const {
    return block * BlockStride() + layer * LayerStride() + kv * KvStride() + head * HeadStride() +
           slot * SlotStride();
  }
  // The address of element `offset` of `pool`.
  const uint8_t* At(const void* pool, int64_t offset) const {
    return static_cast<const uint8_t*>(pool) + offset * ElementBytes();
  }
  uint8_t* At(void* pool, int64_t offset) const { return static_cast<uint8_t*>(pool) + offset * ElementBytes(); }
  // Element `offset` of `pool`, as a float (exact).
  float Value(const void* pool, int64_t offset) const;
  // Writes `n` floats at element `offset`, each rounded to the dtype.
  void Store(void* pool, int64_t offset, const float* values, int64_t n) const;
};

}  // namespace duet::kernels

#endif  // DUET_KERNELS_KV_LAYOUT_H_

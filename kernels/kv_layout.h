// The paged KV cache layout shared by the engine, kernels and kvtransfer.
//
//   KvLayout l{.num_layers = 12, .num_kv_heads = 4, .block_size = 16, .head_dim = 64};
//   float* k = pool + l.Offset(block, layer, /*v=*/0, head, slot);
//
// A pool is `[block][layer][K|V][kv_head][slot][head_dim]`, block-major, so one
// block is one contiguous region and one layer's slice of a block (or one head
// range of it) is a contiguous sub-region: what a KV transfer moves.
#ifndef DUET_KERNELS_KV_LAYOUT_H_
#define DUET_KERNELS_KV_LAYOUT_H_

#include <cstdint>

namespace duet::kernels {

struct KvLayout {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t block_size = 16;
  int64_t head_dim = 0;

  int64_t SlotStride() const { return head_dim; }
  int64_t HeadStride() const { return block_size * head_dim; }
  int64_t KvStride() const { return num_kv_heads * HeadStride(); }
  int64_t LayerStride() const { return 2 * KvStride(); }
  int64_t BlockStride() const { return num_layers * LayerStride(); }
  // Offset, in elements, of one (block, layer, K=0/V=1, head, slot) row.
  int64_t Offset(int64_t block, int64_t layer, int64_t kv, int64_t head, int64_t slot) const {
    return block * BlockStride() + layer * LayerStride() + kv * KvStride() + head * HeadStride() +
           slot * SlotStride();
  }
};

}  // namespace duet::kernels

#endif  // DUET_KERNELS_KV_LAYOUT_H_

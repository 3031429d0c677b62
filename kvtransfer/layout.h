// KV layout conversion between a prefill instance's shards and a decode
// instance's shards: which byte ranges of which source pool go where.
//
//   ASSIGN_OR_RETURN(auto plans, PlanTransfer(prefill_shards, decode_shards, src_ids, dst_ids));
//   for (const TransferPlan& p : plans) transport.Get(p.src_shard, p.dst_shard, p.segments);
//
// Use it wherever KV blocks cross instances: the decode side (which pulls)
// plans once per request, or once per layer range while prefill is still
// computing later layers, and hands the segments to a transport (UCX get,
// NCCL, or ApplySegments for host memory). The planner is pure: it touches no
// memory, and every function here is thread-safe.
//
// A worker's pool shard is `[block][local layer][K|V][local head][slot][head_dim]`
// (DESIGN.md, "KV cache"), holding the layers of its pipeline stage and the kv
// heads of its tensor-parallel rank. This package keeps its own description
// (ShardLayout) instead of kernels::KvLayout so that it does not depend on the
// engine or kernels; the two must describe the same bytes.
#ifndef DUET_KVTRANSFER_LAYOUT_H_
#define DUET_KVTRANSFER_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::kvtransfer {

// One worker's slice of the model's KV cache. Layer and head ranges are
// half-open and in global (model) indices.
struct ShardLayout {
  int64_t num_layers_total = 0;
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  int64_t num_kv_heads_total = 0;
  int64_t head_begin = 0;
  int64_t head_end = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t head_dim = 0;
  int64_t dtype_bytes = 0;  // 4 for F32 (CPU), 2 for BF16 (CUDA)

  int64_t num_layers() const { return layer_end - layer_begin; }
  int64_t num_heads() const { return head_end - head_begin; }
  // Byte strides of the block-major layout.
  uint64_t HeadBytes() const { return static_cast<uint64_t>(block_size * head_dim * dtype_bytes); }
  uint64_t KvBytes() const { return static_cast<uint64_t>(num_heads()) * HeadBytes(); }
  uint64_t LayerBytes() const { return 2 * KvBytes(); }
  uint64_t BlockBytes() const { return static_cast<uint64_t>(num_layers()) * LayerBytes(); }
};

// Bytes one block occupies in this shard's pool.
uint64_t ShardBlockBytes(const ShardLayout& shard);

// A contiguous copy: `length` bytes from `src_offset` in the source pool to
// `dst_offset` in the destination pool.
struct Segment {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;

  friend bool operator==(const Segment&, const Segment&) = default;
};

// Everything one destination shard reads from one source shard. Segments are
// sorted by src_offset, never overlap in the destination, and are minimal:
// two pieces are merged whenever they are adjacent on both sides.
struct TransferPlan {
  int src_shard = 0;  // index into src_shards
  int dst_shard = 0;  // index into dst_shards
  std::vector<Segment> segments;
};

// Plans the move of the logical blocks i = 0..n-1, where logical block i is
// block src_block_ids[s][i] in source shard s and dst_block_ids[d][i] in
// destination shard d. `layer_range` = [a, b) restricts the move to those
// global layers (layer-wise pull). Returns one plan per (src, dst) pair with
// bytes to move, ordered by dst_shard then src_shard, so each decode worker
// finds its pulls together.
//
// InvalidArgument when: a side is empty or its shards do not tile layers x
// heads exactly; block size, head dim, dtype or model totals differ between
// any two shards; the id lists do not match the shard counts or differ in
// length; an id is negative; a destination shard lists one block twice (the
// writes would race); or layer_range is outside [0, num_layers_total].
absl::StatusOr<std::vector<TransferPlan>> PlanTransfer(
    const std::vector<ShardLayout>& src_shards, const std::vector<ShardLayout>& dst_shards,
    const std::vector<std::vector<int32_t>>& src_block_ids,
    const std::vector<std::vector<int32_t>>& dst_block_ids,
    std::optional<std::pair<int64_t, int64_t>> layer_range = std::nullopt);

// Executes segments between two host pools with memcpy (the CPU backend's
// same-process path, and tests). The caller guarantees the pools are large
// enough; segments are not bounds-checked.
void ApplySegments(const uint8_t* src, uint8_t* dst, const std::vector<Segment>& segments);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_LAYOUT_H_

// The paged KV cache of one worker: a pool of fixed-size blocks with
// reference counts, and the per-sequence block tables that index it.
//
//   BlockPool pool(layout, /*num_blocks=*/1024);
//   SequenceKv seq(&pool);
//   RETURN_IF_ERROR(seq.Reserve(prompt.size()));  // ResourceExhausted when full
//
// Storage is one backend buffer (kernels/buffer.h; host memory, huge-page
// backed, unless the caller names the backend's type) in the layout of
// kernels/kv_layout.h ([block][layer][K|V][kv_head][slot][head_dim]), of the
// layout's dtype (f32, bf16 or f16). Its bytes are reached from the host only
// by explicit copies (ReadBlock, WriteBlock, CopyBlock); region_base() is for
// the backend's ops and for registering the pool with a transport. A block is free when its
// reference count is zero; sequences that share a prefix hold the same blocks
// and each drops its reference when it ends, so every block returns to the
// pool exactly once. BlockPool is thread-safe; a SequenceKv belongs to one
// owner at a time.
#ifndef DUET_ENGINE_BLOCK_POOL_H_
#define DUET_ENGINE_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "kernels/buffer.h"
#include "kernels/kv_layout.h"

namespace duet::engine {

class TransferRegion;

class BlockPool {
 public:
  // The storage in `type`'s memory (CHECK-fails where it cannot be had).
  BlockPool(const kernels::KvLayout& layout, int64_t num_blocks,
            kernels::BufferType& type = kernels::HostMemoryType());
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // n fresh blocks with reference count 1, or ResourceExhausted (and none).
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Adds a reference to a block that is in use.
  void Ref(int32_t block);
  // Drops a reference; the block is free again at zero.
  void Unref(int32_t block);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const;
  int RefCount(int32_t block) const;
  const kernels::KvLayout& layout() const { return layout_; }
  // The dtype of the pool's elements as the control plane names it
  // (proto::KvLayout.dtype): "f32", "bf16" or "f16".
  const char* dtype_name() const { return kernels::DTypeName(layout_.dtype); }
  int64_t block_bytes() const { return layout_.BlockBytes(); }
  int64_t bytes() const { return num_blocks_ * block_bytes(); }
  // The storage, for the backend's ops and the transports; the engine reads
  // and writes blocks only through the copies below.
  void* region_base() const { return data_->base(); }
  kernels::Buffer& buffer() { return *data_; }

  // Block `b`'s bytes (block_bytes() of them) to or from the host, and one
  // block's bytes into another's. InvalidArgument for a block outside the pool.
  absl::Status ReadBlock(int32_t b, void* host) const;
  absl::Status WriteBlock(int32_t b, const void* host);
  absl::Status CopyBlock(int32_t src, int32_t dst);

  // Blocks that a pool of `bytes` bytes holds for this layout.
  static int64_t BlocksForBytes(const kernels::KvLayout& layout, int64_t bytes);

 private:
  friend class TransferRegion;
  absl::StatusOr<int64_t> BlockOffset(int32_t b) const;

  const kernels::KvLayout layout_;
  const int64_t num_blocks_;
  kernels::BufferPtr data_;  // zero-filled
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> refs_ ABSL_GUARDED_BY(mu_);
};

// Where the KV transports reach a pool. UCX reads and writes host memory,
// so for a pool in a device's memory (its buffer type is not the host's) a
// host mirror of every block stands in: the exporter copies a request's
// blocks out of the device before it offers them (Stage), the importer
// copies pulled blocks into the device once the pull is done (Land). For a
// host pool both are no-ops and base() is the pool's own memory.
//
//   ASSIGN_OR_RETURN(auto view, TransferRegion::For(&pool));
//   transport->RegisterRegion(view->base(), view->bytes(), ...);
//   RETURN_IF_ERROR(view->Stage(blocks));   // before the KV handle leaves
//
// A block's mirror is written only while the block holds the KV a lease
// promises (shared prefix blocks are staged again with the same bytes), so
// the transports' epochs guard the mirror as they guard the pool. Called
// from the thread that runs the pool's backend.
class TransferRegion {
 public:
  static absl::StatusOr<std::unique_ptr<TransferRegion>> For(BlockPool* pool);

  void* base() const;
  uint64_t bytes() const { return static_cast<uint64_t>(pool_->bytes()); }
  bool mirrored() const { return mirror_ != nullptr; }
  // Pool -> mirror and mirror -> pool, block by block (runs of consecutive
  // blocks as one copy); InvalidArgument for a block outside the pool.
  absl::Status Stage(absl::Span<const int32_t> blocks);
  absl::Status Land(absl::Span<const int32_t> blocks);

 private:
  TransferRegion(BlockPool* pool, kernels::BufferPtr mirror) : pool_(pool), mirror_(std::move(mirror)) {}
  absl::Status Copy(absl::Span<const int32_t> blocks, bool to_mirror);

  BlockPool* pool_;
  kernels::BufferPtr mirror_;  // null for a host pool
};

// One sequence's block table. Releases its references when destroyed.
class SequenceKv {
 public:
  explicit SequenceKv(BlockPool* pool) : pool_(pool) {}
  ~SequenceKv() { Release(); }
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&& other) noexcept;
  SequenceKv& operator=(SequenceKv&& other) noexcept;

  // Grows the table to cover `num_tokens` positions; all-or-nothing.
  absl::Status Reserve(int64_t num_tokens);
  // Starts this (empty) sequence with the first `num_tokens` positions of
  // `other`, sharing its blocks by reference. num_tokens must be a multiple
  // of the block size, so no block is written by two sequences.
  absl::Status SharePrefix(const SequenceKv& other, int64_t num_tokens);
  // Starts this (empty) sequence with `blocks` (full blocks someone else
  // holds, such as the prefix cache's), taking a reference on each.
  absl::Status ShareBlocks(absl::Span<const int32_t> blocks);
  // Drops every reference; the table becomes empty.
  void Release();

  const std::vector<int32_t>& block_table() const { return blocks_; }
  int64_t capacity_tokens() const;

 private:
  BlockPool* pool_;
  std::vector<int32_t> blocks_;
};

}  // namespace duet::engine

#endif  // DUET_ENGINE_BLOCK_POOL_H_

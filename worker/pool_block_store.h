// The knowledge tree's BlockStore over a worker's engine pool: device blocks
// are the engine's KV blocks (by reference count), host slots a separate
// region of this process's memory of `host_slots` blocks, and a swap is a
// real copy of a block's KV between them, as a GPU worker's would be.
//
//   PoolBlockStore store(pool.get(), /*host_slots=*/4096);
//   kvcache::PrefixTree tree({.block_size = 16, .host_tier = true}, &store);
//
// Not thread-safe, like the tree it serves (its worker's engine thread).
#ifndef DUET_WORKER_POOL_BLOCK_STORE_H_
#define DUET_WORKER_POOL_BLOCK_STORE_H_

#include <cstdint>
#include <vector>

#include "base/huge_buffer.h"
#include "engine/block_pool.h"
#include "kvcache/prefix_tree.h"

namespace duet::worker {

class PoolBlockStore : public kvcache::BlockStore {
 public:
  // `pool` must outlive the store; host_slots 0: no host tier.
  PoolBlockStore(engine::BlockPool* pool, int64_t host_slots);

  void RefDevice(absl::Span<const int32_t> blocks) override;
  void UnrefDevice(absl::Span<const int32_t> blocks) override;
  absl::StatusOr<std::vector<int32_t>> AllocateDevice(int64_t n) override;
  absl::StatusOr<std::vector<int32_t>> AllocateHost(int64_t n) override;
  void FreeHost(absl::Span<const int32_t> slots) override;
  void CopyToHost(absl::Span<const int32_t> blocks, absl::Span<const int32_t> slots) override;
  void CopyToDevice(absl::Span<const int32_t> slots, absl::Span<const int32_t> blocks) override;

  int64_t host_slots() const { return host_slots_; }
  // Device blocks only the tree holds (no sequence shares them): free for
  // the taking once the tree evicts them.
  int64_t CacheOnlyBlocks() const;
  int64_t host_used() const { return host_slots_ - static_cast<int64_t>(free_.size()); }
  // Bytes copied each way since start.
  uint64_t bytes_to_host() const { return bytes_to_host_; }
  uint64_t bytes_to_device() const { return bytes_to_device_; }

 private:
  uint8_t* Host(int32_t slot) const;
  // Blocks to their host slots (or back); the bytes moved.
  uint64_t Copy(absl::Span<const int32_t> blocks, absl::Span<const int32_t> slots, bool to_host);

  engine::BlockPool* const pool_;
  const int64_t host_slots_;
  HugeBuffer host_;
  std::vector<int32_t> free_;
  std::vector<bool> in_use_;  // by slot: a double free is a bug
  std::vector<int> tree_refs_;  // by device block: references the tree holds
  uint64_t bytes_to_host_ = 0, bytes_to_device_ = 0;
};

}  // namespace duet::worker

#endif  // DUET_WORKER_POOL_BLOCK_STORE_H_

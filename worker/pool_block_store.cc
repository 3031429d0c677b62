#include "worker/pool_block_store.h"

#include <cstring>

#include "base/logging.h"

namespace duet::worker {

PoolBlockStore::PoolBlockStore(engine::BlockPool* pool, int64_t host_slots)
    : pool_(pool), host_slots_(host_slots) {
  if (host_slots_ > 0) host_ = HugeBuffer(static_cast<size_t>(host_slots_ * pool_->block_bytes()));
  free_.reserve(static_cast<size_t>(host_slots_));
  in_use_.assign(static_cast<size_t>(host_slots_), false);
  tree_refs_.assign(static_cast<size_t>(pool_->num_blocks()), 0);
  for (int64_t s = host_slots_ - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

void PoolBlockStore::RefDevice(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    pool_->Ref(b);
    ++tree_refs_[static_cast<size_t>(b)];
  }
}

void PoolBlockStore::UnrefDevice(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CHECK(tree_refs_[static_cast<size_t>(b)] > 0) << "the tree releases block " << b << " it does not hold";
    --tree_refs_[static_cast<size_t>(b)];
    pool_->Unref(b);
  }
}

int64_t PoolBlockStore::CacheOnlyBlocks() const {
  int64_t n = 0;
  for (size_t b = 0; b < tree_refs_.size(); ++b) {
    if (tree_refs_[b] > 0 && pool_->RefCount(static_cast<int32_t>(b)) == tree_refs_[b]) ++n;
  }
  return n;
}

absl::StatusOr<std::vector<int32_t>> PoolBlockStore::AllocateDevice(int64_t n) {
  absl::StatusOr<std::vector<int32_t>> blocks = pool_->Allocate(n);
  if (blocks.ok()) {
    for (int32_t b : *blocks) ++tree_refs_[static_cast<size_t>(b)];
  }
  return blocks;
}

absl::StatusOr<std::vector<int32_t>> PoolBlockStore::AllocateHost(int64_t n) {
  if (n > static_cast<int64_t>(free_.size())) return absl::ResourceExhaustedError("the host KV tier is full");
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  for (int32_t s : out) in_use_[static_cast<size_t>(s)] = true;
  return out;
}

void PoolBlockStore::FreeHost(absl::Span<const int32_t> slots) {
  for (int32_t s : slots) {
    CHECK(s >= 0 && s < host_slots_ && in_use_[static_cast<size_t>(s)]) << "freeing host slot " << s;
    in_use_[static_cast<size_t>(s)] = false;
    free_.push_back(s);
  }
}

uint8_t* PoolBlockStore::Host(int32_t slot) const {
  return host_.As<uint8_t>() + static_cast<int64_t>(slot) * pool_->block_bytes();
}

uint64_t PoolBlockStore::Copy(absl::Span<const int32_t> blocks, absl::Span<const int32_t> slots, bool to_host) {
  CHECK(blocks.size() == slots.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const absl::Status s =
        to_host ? pool_->ReadBlock(blocks[i], Host(slots[i])) : pool_->WriteBlock(blocks[i], Host(slots[i]));
    CHECK(s.ok()) << s;  // The tree hands out blocks and slots it holds.
  }
  return blocks.size() * static_cast<uint64_t>(pool_->block_bytes());
}

void PoolBlockStore::CopyToHost(absl::Span<const int32_t> blocks, absl::Span<const int32_t> slots) {
  bytes_to_host_ += Copy(blocks, slots, /*to_host=*/true);
}

void PoolBlockStore::CopyToDevice(absl::Span<const int32_t> slots, absl::Span<const int32_t> blocks) {
  bytes_to_device_ += Copy(blocks, slots, /*to_host=*/false);
}

}  // namespace duet::worker

#include "engine/block_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace duet::engine {

namespace {

kernels::BufferPtr PoolStorage(kernels::BufferType& type, int64_t bytes) {
  absl::StatusOr<kernels::BufferPtr> b = type.Allocate(std::max<int64_t>(bytes, 1), "the KV pool");
  CHECK(b.ok()) << b.status();
  return *std::move(b);
}

}  // namespace

BlockPool::BlockPool(const kernels::KvLayout& layout, int64_t num_blocks, kernels::BufferType& type)
    : layout_(layout), num_blocks_(num_blocks),
      data_(PoolStorage(type, layout.BlockBytes() * num_blocks)),
      refs_(num_blocks, 0) {
  // Ops name a token's cache slot as block * block_size + slot, an int32.
  CHECK(num_blocks * layout.block_size <= std::numeric_limits<int32_t>::max())
      << "a KV pool of " << num_blocks << " blocks of " << layout.block_size << " tokens: over 2^31 slots";
  free_.reserve(num_blocks);
  // Hand out low ids first: block tables of a fresh pool read 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

absl::StatusOr<int64_t> BlockPool::BlockOffset(int32_t b) const {
  if (b < 0 || b >= num_blocks_) {
    return absl::InvalidArgumentError(absl::StrCat("block ", b, " is outside the pool of ", num_blocks_));
  }
  return static_cast<int64_t>(b) * block_bytes();
}

absl::Status BlockPool::ReadBlock(int32_t b, void* host) const {
  ASSIGN_OR_RETURN(int64_t offset, BlockOffset(b));
  return data_->Read(offset, host, block_bytes());
}

absl::Status BlockPool::WriteBlock(int32_t b, const void* host) {
  ASSIGN_OR_RETURN(int64_t offset, BlockOffset(b));
  return data_->Write(offset, host, block_bytes());
}

absl::Status BlockPool::CopyBlock(int32_t src, int32_t dst) {
  ASSIGN_OR_RETURN(int64_t from, BlockOffset(src));
  ASSIGN_OR_RETURN(int64_t to, BlockOffset(dst));
  return src == dst ? absl::OkStatus() : data_->CopyFrom(*data_, from, to, block_bytes());
}

absl::StatusOr<std::unique_ptr<TransferRegion>> TransferRegion::For(BlockPool* pool) {
  kernels::BufferPtr mirror;
  if (!pool->buffer().type().IsHost()) {
    ASSIGN_OR_RETURN(mirror, kernels::HostMemoryType().Allocate(std::max<int64_t>(pool->bytes(), 1),
                                                                "the KV pool's host mirror"));
  }
  return std::unique_ptr<TransferRegion>(new TransferRegion(pool, std::move(mirror)));
}

void* TransferRegion::base() const { return mirror_ != nullptr ? mirror_->base() : pool_->region_base(); }

absl::Status TransferRegion::Stage(absl::Span<const int32_t> blocks) { return Copy(blocks, /*to_mirror=*/true); }

absl::Status TransferRegion::Land(absl::Span<const int32_t> blocks) { return Copy(blocks, /*to_mirror=*/false); }

absl::Status TransferRegion::Copy(absl::Span<const int32_t> blocks, bool to_mirror) {
  if (mirror_ == nullptr) return absl::OkStatus();
  const int64_t block_bytes = pool_->block_bytes();
  uint8_t* host = static_cast<uint8_t*>(mirror_->base());
  for (size_t i = 0; i < blocks.size();) {
    size_t run = 1;  // Consecutive blocks move as one copy.
    while (i + run < blocks.size() && blocks[i + run] == blocks[i] + static_cast<int32_t>(run)) ++run;
    ASSIGN_OR_RETURN(int64_t first, pool_->BlockOffset(blocks[i]));
    ASSIGN_OR_RETURN(int64_t last, pool_->BlockOffset(blocks[i + run - 1]));
    const int64_t n = last + block_bytes - first;
    RETURN_IF_ERROR(to_mirror ? pool_->buffer().Read(first, host + first, n)
                              : pool_->buffer().Write(first, host + first, n));
    i += run;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int64_t n) {
  absl::MutexLock lock(&mu_);
  if (n < 0) return absl::InvalidArgumentError("negative block count");
  if (static_cast<int64_t>(free_.size()) < n) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache pool exhausted: ", n,
                                                     " blocks wanted, ", free_.size(), " of ",
                                                     num_blocks_, " free"));
  }
  std::vector<int32_t> out(free_.end() - n, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - n);
  for (int32_t b : out) refs_[b] = 1;
  return out;
}

void BlockPool::Ref(int32_t block) {
  absl::MutexLock lock(&mu_);
  CHECK(block >= 0 && block < num_blocks_) << "block " << block;
  CHECK_GT(refs_[block], 0) << "Ref of free block " << block;
  ++refs_[block];
}

void BlockPool::Unref(int32_t block) {
  absl::MutexLock lock(&mu_);
  CHECK(block >= 0 && block < num_blocks_) << "block " << block;
  CHECK_GT(refs_[block], 0) << "Unref of free block " << block;
  if (--refs_[block] == 0) free_.push_back(block);
}

int64_t BlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

int BlockPool::RefCount(int32_t block) const {
  absl::MutexLock lock(&mu_);
  return refs_[block];
}

int64_t BlockPool::BlocksForBytes(const kernels::KvLayout& layout, int64_t bytes) {
  return bytes / layout.BlockBytes();
}

SequenceKv::SequenceKv(SequenceKv&& other) noexcept
    : pool_(other.pool_), blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

SequenceKv& SequenceKv::operator=(SequenceKv&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = other.pool_;
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

int64_t SequenceKv::capacity_tokens() const {
  return static_cast<int64_t>(blocks_.size()) * pool_->layout().block_size;
}

absl::Status SequenceKv::Reserve(int64_t num_tokens) {
  const int64_t bs = pool_->layout().block_size;
  const int64_t need = (num_tokens + bs - 1) / bs - static_cast<int64_t>(blocks_.size());
  if (need <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int32_t> fresh, pool_->Allocate(need));
  blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  return absl::OkStatus();
}

absl::Status SequenceKv::SharePrefix(const SequenceKv& other, int64_t num_tokens) {
  const int64_t bs = pool_->layout().block_size;
  if (!blocks_.empty()) return absl::FailedPreconditionError("SharePrefix on a non-empty sequence");
  if (other.pool_ != pool_) return absl::InvalidArgumentError("sequences of different pools");
  if (num_tokens % bs != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared prefix of ", num_tokens, " tokens is not a multiple of the block size ", bs));
  }
  if (num_tokens > other.capacity_tokens()) {
    return absl::InvalidArgumentError("shared prefix is longer than the other sequence");
  }
  for (int64_t i = 0; i < num_tokens / bs; ++i) {
    pool_->Ref(other.blocks_[i]);
    blocks_.push_back(other.blocks_[i]);
  }
  return absl::OkStatus();
}

absl::Status SequenceKv::ShareBlocks(absl::Span<const int32_t> blocks) {
  if (!blocks_.empty()) return absl::FailedPreconditionError("ShareBlocks on a non-empty sequence");
  for (int32_t b : blocks) {
    if (b < 0 || b >= pool_->num_blocks()) return absl::InvalidArgumentError(absl::StrCat("no block ", b));
  }
  for (int32_t b : blocks) {
    pool_->Ref(b);
    blocks_.push_back(b);
  }
  return absl::OkStatus();
}

void SequenceKv::Release() {
  for (int32_t b : blocks_) pool_->Unref(b);
  blocks_.clear();
}

}  // namespace duet::engine

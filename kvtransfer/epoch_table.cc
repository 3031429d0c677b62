#include "kvtransfer/epoch_table.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "base/logging.h"

namespace duet::kvtransfer {

absl::Status CheckRegisterRegion(absl::string_view transport, const void* base, uint64_t bytes,
                                 int64_t num_epoch_blocks) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(transport, ": RegisterRegion: empty region"));
  }
  if (num_epoch_blocks < 0 || num_epoch_blocks > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(transport, ": RegisterRegion: bad epoch block count ", num_epoch_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EpochTable>> EpochTable::Allocate(int64_t num_blocks) {
  CHECK(num_blocks >= 0) << "epoch table of " << num_blocks << " blocks";
  const size_t bytes = std::max<size_t>(BytesFor(num_blocks), 64);
  auto* words = static_cast<uint64_t*>(std::aligned_alloc(64, bytes));
  if (words == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate an epoch table of ", num_blocks, " blocks"));
  }
  std::memset(words, 0, bytes);
  return std::unique_ptr<EpochTable>(new EpochTable(words, num_blocks, /*owned=*/true));
}

EpochTable::~EpochTable() {
  if (owned_) std::free(words_);
}

uint64_t EpochTable::Load(int64_t block) const {
  CHECK(block >= 0 && block < num_blocks_) << "epoch block " << block << " of " << num_blocks_;
  return std::atomic_ref<uint64_t>(words_[block]).load(std::memory_order_seq_cst);
}

void EpochTable::Bump(int64_t block) {
  CHECK(block >= 0 && block < num_blocks_) << "epoch block " << block << " of " << num_blocks_;
  std::atomic_ref<uint64_t>(words_[block]).fetch_add(1, std::memory_order_seq_cst);
}

void EpochTable::BumpAll() {
  for (int64_t b = 0; b < num_blocks_; ++b) Bump(b);
}

std::optional<std::string> EpochTable::Broken(EpochPromises promises, absl::string_view when) const {
  return BrokenPromise(promises, [this](int32_t block) { return Load(block); }, when);
}

}  // namespace duet::kvtransfer

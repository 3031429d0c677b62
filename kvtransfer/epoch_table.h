// EpochTable: an exporter's block-epoch table (transport.h, "Leases and
// epochs"), the one every transport keeps: one 64-bit word per block, read
// and bumped with sequentially consistent atomics, and the one check of a
// pull's promises against it. Also the one argument check of RegisterRegion.
//
//   RETURN_IF_ERROR(CheckRegisterRegion("ucx", base, bytes, num_epoch_blocks));
//   ASSIGN_OR_RETURN(std::unique_ptr<EpochTable> epochs, EpochTable::Allocate(num_epoch_blocks));
//   epochs->Bump(7);                                     // a lease on block 7 ended
//   if (auto broken = epochs->Broken(request.block_epochs, "before")) fail(*broken);
//
// An allocated table is 64-byte aligned and padded to a multiple of 64 bytes,
// zeroed, so a transport can register its words for remote reads (UCX);
// a table over words another owns (a shared-memory mapping) frees nothing.
// Thread-safe.
#ifndef DUET_KVTRANSFER_EPOCH_TABLE_H_
#define DUET_KVTRANSFER_EPOCH_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace duet::kvtransfer {

// InvalidArgument, prefixed with `transport`, for a null or empty region or
// an epoch block count outside [0, 2^31].
absl::Status CheckRegisterRegion(absl::string_view transport, const void* base, uint64_t bytes,
                                 int64_t num_epoch_blocks);

using EpochPromises = absl::Span<const std::pair<int32_t, uint64_t>>;

// Why `promises` (block, promised epoch) no longer hold, given each block's
// epoch now (`load(block)`): "block B is at epoch E, the handle promised P
// (lease ended <when> the pull)" for the first that moved; nullopt when all
// hold. For tables read from afar too (UCX reads the exporter's words).
template <typename Load>
std::optional<std::string> BrokenPromise(EpochPromises promises, Load&& load, absl::string_view when) {
  for (const auto& [block, promised] : promises) {
    const uint64_t now = load(block);
    if (now != promised) {
      return absl::StrCat("block ", block, " is at epoch ", now, ", the handle promised ", promised,
                          " (lease ended ", when, " the pull)");
    }
  }
  return std::nullopt;
}

class EpochTable {
 public:
  // A zeroed table of `num_blocks` words it owns. ResourceExhausted when
  // the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<EpochTable>> Allocate(int64_t num_blocks);
  // A table over `num_blocks` words at `words`, which the caller owns and
  // keeps alive.
  EpochTable(uint64_t* words, int64_t num_blocks) : words_(words), num_blocks_(num_blocks), owned_(false) {}
  ~EpochTable();
  EpochTable(const EpochTable&) = delete;
  EpochTable& operator=(const EpochTable&) = delete;

  // CHECK-fail on a block outside [0, num_blocks) (callers check requests
  // with CheckPullBounds first).
  uint64_t Load(int64_t block) const;
  // Ends every lease on `block`; visible before any later write to it.
  void Bump(int64_t block);
  // Ends every lease on every block (a region going away).
  void BumpAll();
  // BrokenPromise over this table.
  std::optional<std::string> Broken(EpochPromises promises, absl::string_view when) const;

  uint64_t* words() const { return words_; }
  int64_t num_blocks() const { return num_blocks_; }
  // The words' size as allocated: num_blocks * 8 rounded up to 64.
  size_t bytes() const { return BytesFor(num_blocks_); }
  static size_t BytesFor(int64_t num_blocks) { return (static_cast<size_t>(num_blocks) * 8 + 63) / 64 * 64; }

 private:
  EpochTable(uint64_t* words, int64_t num_blocks, bool owned)
      : words_(words), num_blocks_(num_blocks), owned_(owned) {}

  uint64_t* words_;
  int64_t num_blocks_;
  bool owned_;
};

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_EPOCH_TABLE_H_

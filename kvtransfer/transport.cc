#include "kvtransfer/transport.h"

#include "absl/strings/str_cat.h"

namespace duet::kvtransfer {

const char* TransferStateName(TransferState state) {
  switch (state) {
    case TransferState::kInFlight:
      return "in_flight";
    case TransferState::kDone:
      return "done";
    case TransferState::kCancelled:
      return "cancelled";
    case TransferState::kPeerLost:
      return "peer_lost";
    case TransferState::kLeaseExpired:
      return "lease_expired";
    case TransferState::kTimedOut:
      return "timed_out";
  }
  return "unknown";
}

TransferResult UnknownTransfer(absl::string_view transport, TransferId id) {
  TransferResult r;
  r.state = TransferState::kCancelled;
  r.detail = absl::StrCat(transport, ": unknown transfer ", id, " (already returned?)");
  return r;
}

absl::StatusOr<uint64_t> CheckPullBounds(const PullRequest& request, uint64_t remote_bytes,
                                         uint64_t local_bytes, uint64_t remote_epoch_blocks) {
  uint64_t total = 0;
  for (const Segment& s : request.segments) {
    uint64_t src_end = 0, dst_end = 0;
    if (s.length == 0 || __builtin_add_overflow(s.src_offset, s.length, &src_end) || src_end > remote_bytes ||
        __builtin_add_overflow(s.dst_offset, s.length, &dst_end) || dst_end > local_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Pull: segment {src ", s.src_offset, ", dst ", s.dst_offset, ", length ", s.length,
          "} is empty or outside the regions (remote ", remote_bytes, " bytes, local ", local_bytes, " bytes)"));
    }
    total += s.length;
  }
  for (const auto& [block, epoch] : request.block_epochs) {
    if (block < 0 || static_cast<uint64_t>(block) >= remote_epoch_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("Pull: epoch block ", block, " outside the exporter's table of ",
                                                     remote_epoch_blocks, " blocks"));
    }
  }
  return total;
}

}  // namespace duet::kvtransfer

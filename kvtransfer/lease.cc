#include "kvtransfer/lease.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::kvtransfer {

const char* EndReasonName(LeaseTable::EndReason reason) {
  switch (reason) {
    case LeaseTable::EndReason::kReleased:
      return "released";
    case LeaseTable::EndReason::kExpired:
      return "expired";
    case LeaseTable::EndReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

LeaseTable::LeaseTable(KvTransport* transport, RegionId region, int64_t num_blocks, Clock* clock,
                       OnEnd on_end)
    : transport_(transport),
      region_(region),
      num_blocks_(num_blocks),
      clock_(clock),
      on_end_(std::move(on_end)) {}

absl::StatusOr<LeaseTable::Lease> LeaseTable::Grant(const std::vector<int32_t>& blocks,
                                                    absl::Duration duration) {
  if (blocks.empty()) return absl::InvalidArgumentError("Grant: no blocks");
  if (duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Grant: lease duration must be positive, got ", absl::FormatDuration(duration)));
  }
  std::vector<int32_t> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= num_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Grant: block ", sorted[i], " outside [0, ", num_blocks_, ")"));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("Grant: block ", sorted[i], " given twice"));
    }
  }
  absl::MutexLock lock(&mu_);
  Lease lease;
  lease.id = next_id_++;
  lease.deadline = clock_->Now() + duration;
  // Read under mu_: an end bumps under mu_ too, so the promised epoch is
  // never one that an end in progress is about to retire.
  for (int32_t b : blocks) {
    lease.block_epochs.push_back({b, transport_->BlockEpoch(region_, b)});
    holders_[b]++;
  }
  leases_[lease.id] = Entry{blocks, lease.deadline};
  by_deadline_.emplace(lease.deadline, lease.id);
  return lease;
}

void LeaseTable::EndLocked(std::map<uint64_t, Entry>::iterator it, EndReason reason,
                           Ended* ended) {
  auto range = by_deadline_.equal_range(it->second.deadline);
  for (auto d = range.first; d != range.second; ++d) {
    if (d->second == it->first) {
      by_deadline_.erase(d);
      break;
    }
  }
  for (int32_t b : it->second.blocks) {
    auto h = holders_.find(b);
    if (--h->second == 0) {
      holders_.erase(h);
      transport_->BumpEpoch(region_, b);
    }
  }
  ended->push_back({it->first, std::move(it->second.blocks), reason});
  leases_.erase(it);
}

void LeaseTable::Notify(Ended& ended) {
  if (!on_end_) return;
  for (auto& e : ended) on_end_(e.id, e.blocks, e.reason);
}

absl::Status LeaseTable::End(uint64_t lease_id, EndReason reason) {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is not live"));
    }
    EndLocked(it, reason, &ended);
  }
  Notify(ended);
  return absl::OkStatus();
}

absl::Status LeaseTable::Release(uint64_t lease_id) { return End(lease_id, EndReason::kReleased); }

absl::Status LeaseTable::Cancel(uint64_t lease_id) { return End(lease_id, EndReason::kCancelled); }

int LeaseTable::ExpireDue() {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
      EndLocked(leases_.find(by_deadline_.begin()->second), EndReason::kExpired, &ended);
    }
  }
  Notify(ended);
  return static_cast<int>(ended.size());
}

int LeaseTable::CancelAll() {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    while (!leases_.empty()) EndLocked(leases_.begin(), EndReason::kCancelled, &ended);
  }
  Notify(ended);
  return static_cast<int>(ended.size());
}

size_t LeaseTable::num_live() const {
  absl::MutexLock lock(&mu_);
  return leases_.size();
}

std::optional<absl::Time> LeaseTable::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  if (by_deadline_.empty()) return std::nullopt;
  return by_deadline_.begin()->first;
}

bool LeaseTable::IsLeased(int32_t block) const {
  absl::MutexLock lock(&mu_);
  return holders_.count(block) != 0;
}

}  // namespace duet::kvtransfer

// LeaseTable: the exporter's (prefill's) record of which KV blocks are
// promised to importers (decode), until when, and at which epoch.
//
//   LeaseTable leases(transport, pool_region, num_blocks, RealClock(), free_blocks);
//   ASSIGN_OR_RETURN(LeaseTable::Lease l, leases.Grant(block_ids, absl::Seconds(30)));
//
// Grant a lease when a request's blocks are fully written and its KvHandle is
// about to be sent: the handle carries l.block_epochs. The lease ends by
// Release (decode pulled them), Cancel (the request was cancelled) or expiry
// (ExpireDue, called periodically, ends every lease past its deadline on the
// injected clock). On every end, the table first bumps the epoch of each
// block no other live lease holds (so a pull racing with reuse reads as
// kLeaseExpired, transport.h), then calls on_end(lease id, blocks, reason) so the owner
// frees them. A block under several leases (a shared prefix sent to two
// decodes) keeps its epoch until the last of them ends; on_end still reports
// every lease's own blocks, so the owner frees a block when its own count of
// references drops to zero.
//
// Thread-safe. on_end runs on the thread that ended the lease, after the
// table's lock is released (it may call back into the table).
#ifndef DUET_KVTRANSFER_LEASE_H_
#define DUET_KVTRANSFER_LEASE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

class LeaseTable {
 public:
  enum class EndReason { kReleased, kExpired, kCancelled };
  using OnEnd = std::function<void(uint64_t lease_id, const std::vector<int32_t>& blocks, EndReason reason)>;

  struct Lease {
    uint64_t id = 0;
    absl::Time deadline;
    // What the KvHandle promises: (block, epoch) for PullRequest::block_epochs.
    std::vector<std::pair<int32_t, uint64_t>> block_epochs;
  };

  // `region` is the exporter's pool in `transport`, registered with
  // num_blocks epoch blocks. transport and clock must outlive the table.
  LeaseTable(KvTransport* transport, RegionId region, int64_t num_blocks, Clock* clock,
             OnEnd on_end);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // InvalidArgument for no blocks, a repeated or out-of-range block, or a
  // non-positive duration.
  absl::StatusOr<Lease> Grant(const std::vector<int32_t>& blocks, absl::Duration duration);
  // NotFound when the lease already ended (e.g. it expired first).
  absl::Status Release(uint64_t lease_id);
  absl::Status Cancel(uint64_t lease_id);
  // Ends, as expired, every lease whose deadline is at or before now; returns how many.
  int ExpireDue();
  // Ends every live lease as cancelled (shutdown); returns how many.
  int CancelAll();

  size_t num_live() const;
  // The earliest deadline of a live lease: when ExpireDue next has work.
  std::optional<absl::Time> NextDeadline() const;
  bool IsLeased(int32_t block) const;

 private:
  struct Entry {
    std::vector<int32_t> blocks;
    absl::Time deadline;
  };
  struct EndedLease {
    uint64_t id;
    std::vector<int32_t> blocks;
    EndReason reason;
  };
  using Ended = std::vector<EndedLease>;
  // Removes the lease and bumps the epochs it alone held; on_end comes later.
  void EndLocked(std::map<uint64_t, Entry>::iterator it, EndReason reason, Ended* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(Ended& ended);
  absl::Status End(uint64_t lease_id, EndReason reason);

  KvTransport* const transport_;
  const RegionId region_;
  const int64_t num_blocks_;
  Clock* const clock_;
  const OnEnd on_end_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> leases_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, uint64_t> by_deadline_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, int> holders_ ABSL_GUARDED_BY(mu_);  // live leases per block
};

const char* EndReasonName(LeaseTable::EndReason reason);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_LEASE_H_

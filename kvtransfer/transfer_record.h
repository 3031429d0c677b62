// The bookkeeping of one pull that the GPU transports (cuda_ipc, nccl) share:
// what a transfer remembers from its PullRequest, how it ends (result,
// duration, metrics), and the checks and results around a transports' table
// of them. A transport's own Transfer derives from TransferRecord and adds
// its mechanism's fields.
//
//   Transfer& t = transfers_[id];
//   t.Begin(request, total_bytes, metrics);
//   ...
//   t.End(TransferState::kDone, "", metrics_);
//   return EraseIdleRegion(regions_, transfers_, region, "cuda_ipc");  // DeregisterRegion
//
// Not thread-safe: the owning transport guards its table.
#ifndef DUET_KVTRANSFER_TRANSFER_RECORD_H_
#define DUET_KVTRANSFER_TRANSFER_RECORD_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_metrics.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {


// 64 random bits, for telling transports (and pairings) apart in addresses.
inline uint64_t RandomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

struct TransferRecord {
  // What Begin takes from the request.
  PeerId peer = 0;
  RegionId local_region = 0;
  std::vector<std::pair<int32_t, uint64_t>> block_epochs;
  uint64_t bytes = 0;  // What the pull moves when it completes.
  absl::Time start, deadline;

  // Starts now, for `request`'s timeout, moving `total_bytes`; counted in
  // flight in `metrics` until End.
  void Begin(const PullRequest& request, uint64_t total_bytes, TransferMetrics& metrics) {
    metrics.Started();
    peer = request.peer;
    local_region = request.local_region;
    block_epochs = request.block_epochs;
    bytes = total_bytes;
    start = absl::Now();
    deadline = start + request.timeout;
  }

  // Terminal: every byte when kDone, none otherwise; recorded in `metrics`.
  void End(TransferState state, std::string detail, TransferMetrics& metrics) {
    TransferResult r;
    r.state = state;
    r.bytes = state == TransferState::kDone ? bytes : 0;
    r.duration = absl::Now() - start;
    r.detail = std::move(detail);
    metrics.Record(r);
    result = std::move(r);
  }

  bool cancelled = false;
  std::optional<TransferResult> result;  // Terminal (End), not yet returned.
};

// The entry of `region` in `regions` (a map by RegionId), or NotFound.
template <typename RegionMap>
absl::StatusOr<typename RegionMap::iterator> FindRegion(RegionMap& regions, RegionId region,
                                                        absl::string_view transport) {
  auto it = regions.find(region);
  if (it == regions.end()) return absl::NotFoundError(absl::StrCat(transport, ": unknown region ", region));
  return it;
}

// The entry of a pull's destination (`request.local_region`) in `regions`,
// or InvalidArgument: a pull naming an unknown destination is malformed.
template <typename RegionMap>
absl::StatusOr<typename RegionMap::iterator> FindPullDestination(RegionMap& regions, const PullRequest& request,
                                                                 absl::string_view transport) {
  auto it = regions.find(request.local_region);
  if (it == regions.end()) {
    return absl::InvalidArgumentError(absl::StrCat(transport, ": unknown local region ", request.local_region));
  }
  return it;
}

// Deregisters `region` of `regions` (a map by RegionId): NotFound for an
// unknown one, FailedPrecondition while a transfer of `transfers` (a map of
// id to TransferRecord) still writes into it.
template <typename RegionMap, typename TransferMap>
absl::Status EraseIdleRegion(RegionMap& regions, const TransferMap& transfers, RegionId region,
                             absl::string_view transport) {
  absl::StatusOr<typename RegionMap::iterator> it = FindRegion(regions, region, transport);
  if (!it.ok()) return it.status();
  for (const auto& [id, t] : transfers) {
    if (t.local_region == region && !t.result.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(transport, ": region ", region,
                                                        " is the destination of transfer ", id, ", still in flight"));
    }
  }
  regions.erase(*it);
  return absl::OkStatus();
}

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_TRANSFER_RECORD_H_

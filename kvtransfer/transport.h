// KvTransport: moves KV cache bytes from a worker that exported them to a
// worker that pulls them, over UCX (host memory), CUDA IPC or NCCL (GPU).
//
//   KvTransportPtr t = NewUcxTransport(options).value();
//   RegionId pool = t->RegisterRegion(base, bytes, num_blocks).value();
//   ... the exporter sends ExportRegion(pool) and address() over the control plane ...
//   TransferId id = t->Pull(request).value();        // returns at once
//   TransferResult r = t->Wait(id);                   // done, cancelled, peer lost, ...
//
// Decode pulls (it knows when it has memory): the importer connects to the
// exporter named in a KV handle and issues one-sided reads of contiguous
// segments (kvtransfer/layout.h computes them for any TP/PP pair). The
// exporter's CPU takes no part in a pull.
//
// Leases and epochs. An exporter registers its pool with an epoch table, one
// 64-bit counter per block, itself readable remotely. Whenever a block's
// lease ends (released or expired) the exporter bumps its epoch before the
// block can be reused. A pull carries the epochs its handle promised, reads
// them before and after its data reads, and ends as kLeaseExpired unless
// both reads match: bytes that raced with reuse are never reported as KV.
//
// Every transfer ends in exactly one terminal state. Thread-safe: all methods
// may be called from any thread.
#ifndef DUET_KVTRANSFER_TRANSPORT_H_
#define DUET_KVTRANSFER_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kvtransfer/layout.h"

namespace duet::kvtransfer {

using RegionId = uint32_t;
using PeerId = uint32_t;
using TransferId = uint64_t;

enum class TransferState {
  kInFlight,
  kDone,
  kCancelled,
  kPeerLost,      // The exporter died or its endpoint failed.
  kLeaseExpired,  // A block's epoch changed: the lease ended before or during the pull.
  kTimedOut,      // Not finished by the request's deadline.
};
const char* TransferStateName(TransferState state);

struct TransferResult {
  TransferState state = TransferState::kInFlight;
  uint64_t bytes = 0;  // Bytes moved (all of them when kDone).
  absl::Duration duration;
  std::string detail;  // Why, for failures (the library's own error string when it has one).
};

struct PullRequest {
  PeerId peer = 0;
  std::string remote_region;  // ExportRegion() bytes of the exporter's pool.
  RegionId local_region = 0;  // Destination region in this transport.
  std::vector<Segment> segments;  // src_offset in the remote region, dst_offset in the local one.
  // Blocks of the exporter's epoch table this pull depends on, each with the
  // epoch the KV handle promised. Empty: no lease check.
  std::vector<std::pair<int32_t, uint64_t>> block_epochs;
  absl::Duration timeout = absl::Seconds(5);
};

// InvalidArgument unless every segment of `request` is non-empty and lies
// inside both the exporter's region (`remote_bytes`) and the destination
// (`local_bytes`), offsets and lengths without overflow, and every block it
// promises an epoch for lies inside the exporter's table of
// `remote_epoch_blocks`; the bytes the pull moves otherwise. Every
// transport's Pull checks a request with it before it moves a byte.
absl::StatusOr<uint64_t> CheckPullBounds(const PullRequest& request, uint64_t remote_bytes,
                                         uint64_t local_bytes, uint64_t remote_epoch_blocks);

// What Poll and Wait return for an id they do not know (already returned?):
// kCancelled, "<transport>: unknown transfer <id> (already returned?)".
TransferResult UnknownTransfer(absl::string_view transport, TransferId id);

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  virtual std::string Name() const = 0;  // "ucx", "loopback", "cuda_ipc", "nccl"
  // Opaque bytes a peer passes to Connect to reach this transport.
  virtual std::string address() const = 0;

  // Registers [base, base + bytes) for remote reads and as a pull
  // destination. num_epoch_blocks > 0 attaches an epoch table of that many
  // blocks, all at epoch 0 (exporters need one; importers pass 0).
  virtual absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t bytes,
                                                  int64_t num_epoch_blocks) = 0;
  virtual absl::Status DeregisterRegion(RegionId region) = 0;
  // Bytes that let a connected peer read this region (address, key, epochs).
  virtual absl::StatusOr<std::string> ExportRegion(RegionId region) = 0;

  // Exporter side: the epoch a handle for `block` promises now, and the bump
  // that ends every lease on it (call before the block is written again).
  virtual uint64_t BlockEpoch(RegionId region, int32_t block) = 0;
  virtual void BumpEpoch(RegionId region, int32_t block) = 0;

  virtual absl::StatusOr<PeerId> Connect(const std::string& peer_address) = 0;
  // Drops the endpoint; its transfers end as kCancelled.
  virtual void Disconnect(PeerId peer) = 0;

  // Starts a pull and returns at once. InvalidArgument for a malformed
  // request (unknown region or peer, segment out of bounds, bad descriptor).
  virtual absl::StatusOr<TransferId> Pull(const PullRequest& request) = 0;
  // The result once terminal (then forgotten), nullopt while in flight.
  virtual std::optional<TransferResult> Poll(TransferId id) = 0;
  // Blocks until the transfer is terminal; bounded by its timeout.
  virtual TransferResult Wait(TransferId id) = 0;
  // Ends a transfer as kCancelled if it has not ended yet.
  virtual void Cancel(TransferId id) = 0;
};

using KvTransportPtr = std::unique_ptr<KvTransport>;

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_TRANSPORT_H_

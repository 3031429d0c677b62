// KvPuller: the decode worker's KvImporter — pulls a request's KV blocks from
// the prefill worker named in its KvHandle over a KvTransport (UCX in
// production, loopback in tests) and tells that prefill when it may reuse
// them (KvReleased).
//
//   KvPuller puller({.transport = t, .local_region = r, .local_layout = l, .sink = sink});
//   RETURN_IF_ERROR(kvtransfer::CheckHandle(offer.handle(), own_layout));  // on receipt
//   puller.Track(id, offer.handle());   // then BatchEngine calls Start/Poll/Abandon
//
// A pull is planned with kvtransfer::PlanTransfer (one source shard, the
// whole model on the CPU backend, into this worker's one shard), carries the
// handle's epochs so a pull that raced with the lease's end fails as
// lease_expired, and is asynchronous: the engine polls it between decode
// steps. Peers are connected once per data address; a lost peer's entry is
// dropped so the next pull reconnects.
//
// Thread-safety: Track/Start/Poll/Abandon on the engine thread only; the
// counters may be read from any thread.
#ifndef DUET_DECODE_KV_PULLER_H_
#define DUET_DECODE_KV_PULLER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "decode/kv_importer.h"
#include "engine/block_pool.h"
#include "kvtransfer/layout_proto.h"
#include "kvtransfer/transport.h"
#include "proto/control.pb.h"
#include "worker/frame_sink.h"

namespace duet::decode {

class KvPuller : public KvImporter {
 public:
  struct Options {
    kvtransfer::KvTransport* transport = nullptr;
    kvtransfer::RegionId local_region = 0;  // This worker's pool, registered as a destination.
    proto::KvLayout local_layout;
    absl::Duration timeout = absl::Seconds(5);
    worker::FrameSink* sink = nullptr;  // For KvReleased.
    // Where local_region is when it is not the pool itself (a device pool's
    // host mirror): pulled blocks land in the pool from there. Null: the
    // region is the pool.
    engine::TransferRegion* landing = nullptr;
  };
  explicit KvPuller(Options options);

  // Remembers where request_id's KV lives until its pull ends or is abandoned.
  void Track(uint64_t request_id, proto::KvHandle handle);

  absl::Status Start(uint64_t request_id, absl::Span<const int32_t> blocks) override;
  std::optional<absl::Status> Poll(uint64_t request_id) override;
  void Abandon(uint64_t request_id) override;

  uint64_t bytes_moved() const { return bytes_moved_.load(std::memory_order_relaxed); }
  int64_t blocks_transferred() const { return blocks_transferred_.load(std::memory_order_relaxed); }

 private:
  struct Pending {
    proto::KvHandle handle;
    std::optional<kvtransfer::TransferId> transfer;
    // The transfer's result when the Poll that Start makes right after the
    // pull already had it (the transport has forgotten the id then).
    std::optional<kvtransfer::TransferResult> ended;
    int64_t num_blocks = 0;  // Blocks that hold the handle's positions.
    std::vector<int32_t> dst;  // This pool's blocks the pull fills.
  };
  // Tells the prefill it may reuse the blocks (best effort) and forgets the request.
  void Release(uint64_t request_id, const proto::KvHandle& handle, bool pulled);

  const Options options_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::map<std::string, kvtransfer::PeerId> peers_;  // By data address.
  std::atomic<uint64_t> bytes_moved_{0};
  std::atomic<int64_t> blocks_transferred_{0};
};

}  // namespace duet::decode

#endif  // DUET_DECODE_KV_PULLER_H_

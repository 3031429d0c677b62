#include "decode/kv_puller.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "proto/frame.h"

namespace duet::decode {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

KvPuller::KvPuller(Options options) : options_(std::move(options)) {}

void KvPuller::Track(uint64_t request_id, proto::KvHandle handle) {
  Pending& p = pending_[request_id];
  p.num_blocks = CeilDiv(handle.num_tokens(), handle.layout().block_size());
  p.handle = std::move(handle);
}

absl::Status KvPuller::Start(uint64_t request_id, absl::Span<const int32_t> blocks) {
  auto it = pending_.find(request_id);
  if (it == pending_.end()) return absl::InternalError(absl::StrCat("no KV handle for request ", request_id));
  Pending& p = it->second;
  const proto::KvHandle& h = p.handle;
  auto fail = [&](absl::Status why, const std::string& what) {
    absl::Status s(why.code(), absl::StrCat("KV pull failed: ", what, ": ", why.message()));
    Release(request_id, h, /*pulled=*/false);  // Invalidates h and p.
    return s;
  };
  if (static_cast<int64_t>(blocks.size()) < p.num_blocks) {
    return fail(absl::InternalError("fewer destination blocks than the handle's"), "plan");
  }

  kvtransfer::PeerId peer;
  if (auto found = peers_.find(h.data_address()); found != peers_.end()) {
    peer = found->second;
  } else {
    absl::StatusOr<kvtransfer::PeerId> connected = options_.transport->Connect(h.data_address());
    if (!connected.ok()) {
      // Whatever the transport says, the exporter is out of reach: the router may retry elsewhere.
      return fail(absl::UnavailableError(connected.status().message()), "connect");
    }
    peer = *connected;
    peers_[h.data_address()] = peer;
  }

  std::vector<int32_t> src(h.block_ids().begin(), h.block_ids().begin() + p.num_blocks);
  std::vector<int32_t> dst(blocks.begin(), blocks.begin() + p.num_blocks);
  auto plans = kvtransfer::PlanTransfer({kvtransfer::ShardFromProto(h.layout())}, {kvtransfer::ShardFromProto(options_.local_layout)},
                                        {src}, {dst});
  if (!plans.ok()) return fail(plans.status(), "plan");

  kvtransfer::PullRequest req;
  req.peer = peer;
  req.remote_region = h.region();
  req.local_region = options_.local_region;
  for (kvtransfer::TransferPlan& plan : *plans) {
    req.segments.insert(req.segments.end(), plan.segments.begin(), plan.segments.end());
  }
  for (int i = 0; i < h.block_epochs_size(); ++i) req.block_epochs.emplace_back(h.block_ids(i), h.block_epochs(i));
  req.timeout = options_.timeout;
  absl::StatusOr<kvtransfer::TransferId> id = options_.transport->Pull(req);
  if (!id.ok()) return fail(id.status(), "start");
  p.transfer = *id;
  p.dst = std::move(dst);
  // One Poll now tells the transport nobody will Wait for this pull, so it
  // copies it in the background at once. Otherwise a same-host pull waits
  // for the engine's next Poll (a step later) or the progress thread's idle
  // tick before its copy starts. A step that ended before the copy means the
  // request joins the batch one step later than its bytes allowed.
  p.ended = options_.transport->Poll(*id);
  return absl::OkStatus();
}

std::optional<absl::Status> KvPuller::Poll(uint64_t request_id) {
  auto it = pending_.find(request_id);
  if (it == pending_.end() || !it->second.transfer.has_value()) {
    return absl::InternalError(absl::StrCat("no KV pull in flight for request ", request_id));
  }
  std::optional<kvtransfer::TransferResult> r = it->second.ended.has_value()
                                                   ? std::exchange(it->second.ended, std::nullopt)
                                                   : options_.transport->Poll(*it->second.transfer);
  if (!r.has_value()) return std::nullopt;
  const proto::KvHandle handle = std::move(it->second.handle);
  const int64_t num_blocks = it->second.num_blocks;
  if (r->state == kvtransfer::TransferState::kDone && options_.landing != nullptr) {
    if (absl::Status landed = options_.landing->Land(it->second.dst); !landed.ok()) {
      Release(request_id, handle, /*pulled=*/true);
      return absl::InternalError(absl::StrCat("KV pull failed: landing the blocks: ", landed.message()));
    }
  }
  if (r->state == kvtransfer::TransferState::kDone) {
    bytes_moved_.fetch_add(r->bytes, std::memory_order_relaxed);
    blocks_transferred_.fetch_add(num_blocks, std::memory_order_relaxed);
    Release(request_id, handle, /*pulled=*/true);
    return absl::OkStatus();
  }
  // The endpoint is gone; a later pull from this exporter (restarted, say)
  // must connect afresh.
  if (r->state == kvtransfer::TransferState::kPeerLost) peers_.erase(handle.data_address());
  Release(request_id, handle, /*pulled=*/false);
  absl::Status failed = absl::UnavailableError(
      absl::StrCat("KV pull failed: ", kvtransfer::TransferStateName(r->state), ": ", r->detail));
  LOG(WARNING) << "request " << request_id << ": " << failed.message();
  return failed;
}

void KvPuller::Abandon(uint64_t request_id) {
  auto it = pending_.find(request_id);
  if (it == pending_.end()) return;
  bool pulled = false;
  if (it->second.ended.has_value()) {
    pulled = it->second.ended->state == kvtransfer::TransferState::kDone;  // already over
  } else if (it->second.transfer.has_value()) {
    // Wait, bounded by the transport, until the transfer has ended: the
    // caller frees the destination blocks next, and a late read landing in
    // a reused block would corrupt another request's KV.
    options_.transport->Cancel(*it->second.transfer);
    pulled = options_.transport->Wait(*it->second.transfer).state == kvtransfer::TransferState::kDone;
  }
  const proto::KvHandle handle = std::move(it->second.handle);
  Release(request_id, handle, pulled);
}

void KvPuller::Release(uint64_t request_id, const proto::KvHandle& handle, bool pulled) {
  proto::Frame f = proto::NewFrame();
  f.mutable_kv_released()->set_request_id(request_id);
  f.mutable_kv_released()->set_pulled(pulled);
  const std::string address = handle.control_address();
  pending_.erase(request_id);
  // Best effort: a prefill we cannot reach frees the blocks at lease expiry.
  options_.sink->SendToPeer(address, f, [request_id, address](absl::Status s) {
    LOG(WARNING) << "cannot tell prefill " << address << " that request " << request_id
                 << "'s blocks are free: " << s;
  });
}

}  // namespace duet::decode

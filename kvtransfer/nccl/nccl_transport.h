// NCCL KvTransport: decode pulls KV blocks out of a prefill worker's GPU pool
// on another node (or another GPU of the same node) with NCCL point-to-point
// (ncclSend/ncclRecv over NVLink, InfiniBand/RoCE with GPUDirect, or sockets).
// Built only under --config=cuda.
//
//   ASSIGN_OR_RETURN(KvTransportPtr t, NewNcclTransport({.device = 0}));
//   ASSIGN_OR_RETURN(RegionId pool, t->RegisterRegion(dev_ptr, bytes, num_blocks));
//   ... give one importer t->address() and t->ExportRegion(pool) ...
//
// NCCL is two-sided, so unlike UCX and CUDA IPC the exporter takes part in
// every pull (a thread per importer; its CPU only handles 64-byte control
// messages, the GPU moves the data).
//
// Pairing. Each exporter-importer pair has its own 2-rank communicator:
// exporter rank 0, importer rank 1. The exporter generates an ncclUniqueId
// and carries it in address(); Connect(address) calls ncclCommInitRank as
// rank 1 while the exporter's accept thread waits in it as rank 0. One unique
// id pairs exactly one importer: once an importer has joined, the exporter
// generates the next id and address() returns a new value. So the control
// plane must fetch address() afresh for each importer (a decode worker asks
// the prefill worker for it right before connecting); a used or stale
// address makes Connect fail with Unavailable after connect_timeout.
//
// Protocol on a pair's communicator (nccl_wire.h has the formats):
//   importer -> exporter  64-byte pull header, then the segment and epoch lists
//   exporter -> importer  64-byte reply: ok, lease expired, unknown region, bad request
//   exporter -> importer  if ok: each segment (ncclSend from the exporter's
//                         region straight into ncclRecv on the importer's)
//   exporter -> importer  64-byte trailer: the promised epochs re-read after
//                         the sends completed (ok or lease expired)
// Epochs are checked exporter-side, before and after the data left the
// region (the epoch table is plain host memory of the exporter). A pull is
// kDone only if the reply and the trailer both say ok. The exporter's serve
// thread posts its receive for the next header and waits; the importer's
// per-peer worker runs its pulls one at a time in FIFO order, because both
// ranks must issue their NCCL operations in the same order.
//
// Timeouts, cancel, failures. A queued pull that has not started ends at
// once on Cancel or at its deadline. A started pull cannot be withdrawn
// without desynchronising the pair: Cancel marks it and it ends kCancelled
// when its exchange completes. At its deadline a started pull aborts the
// communicator (ncclCommAbort is NCCL's only way to stop a posted receive),
// waits for the stream to go idle and ends kTimedOut; the peer's other pulls
// then end kPeerLost and the importer must Connect again with a fresh
// address. Errors NCCL reports asynchronously (ncclCommGetAsyncError: a
// dead or aborted peer, a network error) end pulls as kPeerLost with
// ncclGetErrorString and ncclGetLastError in the detail. In every case a
// transfer is reported terminal only once its stream is idle: no byte of it
// lands in the destination after Poll/Wait returned. A serve step that waits
// longer than serve_step_timeout (an importer that vanished mid-pull) aborts
// that pair on the exporter.
//
// NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU
// detected"), so exporter and importer must use different devices; on one
// node with one GPU use the CUDA IPC transport.
//
// Thread-safe: every method may be called from any thread. Connect blocks
// until the pair's communicator is up (bounded by connect_timeout); Wait
// blocks until the transfer ends; Disconnect and the destructor join threads.
#ifndef DUET_KVTRANSFER_NCCL_NCCL_TRANSPORT_H_
#define DUET_KVTRANSFER_NCCL_NCCL_TRANSPORT_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

struct NcclOptions {
  // CUDA device of this transport's communicators and regions.
  int device = 0;
  // Accept importers and serve their pulls (exporters). An importer-only
  // transport may turn it off; its address() is then empty.
  bool serve = true;
  // How long Connect waits for the exporter to join the communicator.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Exporter: how long one step of a pull (a control message, the data) may
  // wait for the importer before the pair is dropped.
  absl::Duration serve_step_timeout = absl::Seconds(60);
};

// Unavailable without a CUDA device; errors carry CUDA's or NCCL's string.
absl::StatusOr<KvTransportPtr> NewNcclTransport(const NcclOptions& options);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_NCCL_NCCL_TRANSPORT_H_

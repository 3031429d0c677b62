// CUDA IPC KvTransport: decode pulls KV blocks straight out of a prefill
// worker's GPU pool when both processes run on the same host (same or
// different GPUs of one node). Built only under --config=cuda.
//
//   ASSIGN_OR_RETURN(KvTransportPtr t, NewCudaIpcTransport({.device = 0}));
//   ASSIGN_OR_RETURN(RegionId pool, t->RegisterRegion(dev_ptr, bytes, num_blocks));
//   ... send t->address() and t->ExportRegion(pool) over the control plane ...
//
// Mechanism, per KvTransport call:
// - RegisterRegion: `base` must be device memory (cudaMalloc); exporters get
//   an epoch table in a POSIX shared-memory segment (host memory), named in
//   the descriptor, that importers on the host map read-only.
// - ExportRegion: versioned bytes (ipc_wire.h) with the cudaIpcMemHandle_t
//   of the allocation holding the region, the region's offset in it, its
//   size, and the epoch table's name and block count.
// - address(): host boot id + pid + process/transport nonces. Connect only
//   records the peer (it must be on this host and alive); no handshake.
// - Pull: opens the handle (cudaIpcOpenMemHandle, cached per descriptor,
//   closed on Disconnect or destruction; same-process pulls use the pointer),
//   reads the promised epochs, enqueues one cudaMemcpyAsync device-to-device
//   per segment on this transport's stream and records an event. Poll
//   queries the event; when it has fired the epochs are read again and the
//   pull ends kDone only if both reads matched the promise. The exporter's
//   CPU takes no part.
//
// Terminal-state rule: a device copy cannot be aborted, so a transfer is
// reported terminal only once its copies have finished. After any terminal
// result (kCancelled and kTimedOut included) no byte of that pull is written
// into the destination any more, and the caller may reuse it. Cancel and
// Disconnect mark the transfer; Poll reports kCancelled when its copies have
// drained. A pull still running at its deadline ends kTimedOut when it
// drains, so Wait is bounded by the copy, not by the timeout. A pull whose
// exporter process has exited ends kPeerLost.
//
// Limits: exporter and importer must run as the same user (the shm segment
// is 0600) and in one pid namespace for the liveness check; memory from
// VMM/stream-ordered allocators cannot be exported with cudaIpcGetMemHandle
// (ExportRegion then fails with CUDA's error string).
//
// Thread-safe: every method may be called from any thread. Wait and
// Disconnect block on CUDA events; nothing else blocks on the device.
#ifndef DUET_KVTRANSFER_CUDA_IPC_CUDA_IPC_TRANSPORT_H_
#define DUET_KVTRANSFER_CUDA_IPC_CUDA_IPC_TRANSPORT_H_

#include "absl/status/statusor.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

struct CudaIpcOptions {
  // CUDA device (ordinal) whose stream runs this transport's copies; local
  // regions should live on it.
  int device = 0;
};

// Unavailable when there is no CUDA device (or driver), with CUDA's error string.
absl::StatusOr<KvTransportPtr> NewCudaIpcTransport(const CudaIpcOptions& options);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_CUDA_IPC_CUDA_IPC_TRANSPORT_H_

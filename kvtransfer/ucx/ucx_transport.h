// UcxKvTransport: the KvTransport over UCX one-sided reads (UCP RMA), for
// KV cache in host memory on any network UCX reaches (TCP, shared memory,
// RDMA). Use it in prefill (exporter) and decode (importer) workers.
//
//   ASSIGN_OR_RETURN(KvTransportPtr t, NewUcxTransport(UcxTransportOptions{}));
//   ASSIGN_OR_RETURN(PeerId p, t->Connect(exporter_address));  // then Pull/Wait
//
// One UCP worker per transport, driven by one progress thread that does the
// data path's UCX work; every UCX call is made under one mutex. Pull issues
// the first reads itself (at most 64 KiB, typically the epoch reads, never
// waiting for them) and leaves the rest to that thread, so no caller blocks
// on the network. A pull runs in three phases: read the promised blocks'
// epochs, read the segments (one ucp_get_nbx each, straight into the
// registered destination), read the epochs again; it is kDone only if both
// epoch reads equal the promised ones. A pull that ends in any other state may
// have written part of its destination: those bytes are not KV.
//
// Same-host lane. UCX 1.13 picks no shared-memory lane for RMA on endpoints
// with peer error handling (TCP carries even a pull between two processes of
// one host, and every read wakes the exporter's progress thread). So when
// both ends run on one host (same boot id and PID namespace), the importer
// reads the exporter's registered memory itself with process_vm_readv
// (cross-memory attach, the mechanism of UCX's own cma transport): one-sided,
// no exporter thread involved, up to 1024 segments a system call, the same
// three phases. Liveness comes from a pidfd of the exporter, watched by the
// progress thread and checked after every copy, so bytes read from a pid
// are only accepted while that pid still names the exporter. Connect probes
// a nonce in the exporter's memory first and falls back to UCX endpoints
// where the kernel refuses (another user, ptrace restrictions). The lane is
// used unless same_host_lane is false or UCX_TLS (environment or
// ucx_config) leaves out UCX's intra-node transports (it must name all, sm,
// shm or cma, or exclude none of them with "^"); UCX_TLS=tcp keeps every
// pull on UCX. A same-host pull of up to 64 KiB is copied inside Pull;
// a larger one by the caller that Waits for it, or, once Poll has asked
// about it (or at the progress thread's next tick), by the progress thread
// in steps of 32 MiB. Pull wakes no thread for it: on a VM the wake-up
// alone costs a concurrent copy tens of microseconds. A step of 1 MiB or
// more is shared with same_host_copy_threads - 1 helper threads.
//
// Failures: endpoints use UCP_ERR_HANDLING_MODE_PEER and short keepalives
// (UCX's at 1 s; with UCX_TLS=tcp instead TCP's socket probes after 1 s idle,
// every 1 s, 3 of them, and a TCP_USER_TIMEOUT of the same 4 s for a socket
// holding unacknowledged data, which gets no probes; the environment's UCX_*
// settings win), so a dead exporter fails its transfers as kPeerLost within
// the default 5 s pull timeout, and with UCX_TLS=tcp so does one whose link
// is cut (about 4 s;
// with other transports too, UCX's keepalive messages stall in the cut
// socket and stop TCP's probes, and the pull ends kTimedOut); the
// endpoint is then force-closed and a later Connect to the same address makes
// a new one. At a deadline (kTimedOut) or Cancel (kCancelled) the transfer's
// reads are cancelled and drained before it is reported, so its destination is
// never written after Poll/Wait returned; reads that do not drain within
// cancel_grace force-close their endpoint (its other transfers end kPeerLost).
// Wait therefore returns at the latest about cancel_grace + 1 s past the
// deadline.
//
// Address: a small versioned header around ucp_worker_get_address's bytes,
// then the host section (boot id, PID namespace, pid, probe word, nonce).
// ExportRegion: a versioned little-endian record (magic "DKVR", version 1,
// base, length, packed rkey, epoch table address, block count, epoch rkey).
// Both are validated on receipt; malformed bytes are InvalidArgument.
//
// Metrics (MetricsRegistry::Default(), transport="ucx"):
// duet_kv_transfer_bytes_total and duet_kv_transfer_seconds for kDone pulls,
// duet_kv_transfer_failures_total{reason=peer_lost|lease_expired|timed_out|cancelled},
// duet_kv_transfers_in_flight.
//
// Poll and Wait of an id that is unknown or already collected return
// kCancelled with detail "unknown transfer <id>".
//
// Thread-safe. Exporters call BumpEpoch/BlockEpoch without touching the UCX
// worker (they never wait for the progress thread).
#ifndef DUET_KVTRANSFER_UCX_UCX_TRANSPORT_H_
#define DUET_KVTRANSFER_UCX_UCX_TRANSPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace duet::kvtransfer {

struct UcxTransportOptions {
  // UCP settings applied after the environment's UCX_* variables, without the
  // UCX_ prefix, e.g. {{"TLS", "tcp"}}. They win over the environment.
  std::vector<std::pair<std::string, std::string>> ucx_config;
  // UCX keepalive period: a dead peer with no traffic in flight is found in
  // about two of these. Not applied when UCX_TLS is "tcp" (TCP's probes
  // below find a dead peer or a cut link). UCX_KEEPALIVE_INTERVAL in the
  // environment wins.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // TCP keepalive of UCX's tcp transport, applied when UCX_TLS is "tcp"
  // (UCX_TCP_KEEPIDLE, _KEEPINTVL, _KEEPCNT in the environment win). A peer whose link is cut while our
  // reads wait on its replies leaves our socket with nothing to send, so
  // TCP's retransmission never notices; these probes then fail the endpoint
  // after about idle + count x interval (4 s), inside the default 5 s pull
  // timeout. UCX's own defaults (10 s, 2 s) would not. A socket holding
  // unacknowledged data gets no probes: the transport gives every keepalive
  // socket a TCP_USER_TIMEOUT of the same bound.
  absl::Duration tcp_keepalive_idle = absl::Seconds(1);
  absl::Duration tcp_keepalive_interval = absl::Seconds(1);
  int tcp_keepalive_count = 3;
  // After a deadline or Cancel, how long outstanding reads may take to drain
  // before their endpoint is force-closed.
  absl::Duration cancel_grace = absl::Milliseconds(200);
  // Spin on ucp_worker_progress while transfers are in flight instead of
  // sleeping on the worker's event fd (lower latency, one busy core).
  bool busy_poll = false;
  // After any UCX event (a reply, a peer's read served), keep polling the
  // worker this long before sleeping on its event fd: a pull's next phase,
  // on either side, then costs no thread wake-up (tens of microseconds on a
  // VM; tools/bench:kvtransfer shows both). The price is up to this much CPU
  // after each burst of traffic, and on oversubscribed cores much more: a
  // thread that spins loses the scheduler's preference for threads that
  // slept, and pulls then wait for time slices. Give a worker that sets it
  // a core to spare. Zero sleeps at once.
  absl::Duration spin_window = absl::ZeroDuration();
  // Read exporters on this host with process_vm_readv (see above).
  bool same_host_lane = true;
  // Threads that copy one same-host pull of 1 MiB or more together, the
  // thread running the copy included (1: it copies alone). The kernel pins
  // the exporter's pages per piece, so one thread reads scattered slices
  // (layer-wise pulls) well below memory bandwidth; a second one recovers
  // it. At most as many threads as the process may run on cores
  // (sched_getaffinity). The helpers spin up to 100 us after each copy
  // before they sleep: on a worker whose cores are all busy computing, set 1.
  int same_host_copy_threads = 2;
};

// Creates the UCP context, worker and progress thread. Errors carry UCX's own
// message (e.g. no usable transport in UCX_TLS).
absl::StatusOr<KvTransportPtr> NewUcxTransport(const UcxTransportOptions& options);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_UCX_UCX_TRANSPORT_H_

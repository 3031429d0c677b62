// UcxKvTransport, the KvTransport of ucx_transport.h, and what its files
// share: ucx_transport.cc (UCP: the worker, its progress thread, endpoints,
// RMA pulls with their epoch checks, Connect, Pull, Poll, Wait, Cancel) and
// ucx_same_host.cc (the same-host lane: process_vm_readv between processes
// of one host, its copy threads, exporters' pidfds). The wire records are in
// ucx_wire.h. Private to //kvtransfer/ucx:ucx_transport.
#ifndef DUET_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_
#define DUET_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_

#include "kvtransfer/ucx/ucx_transport.h"
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "kvtransfer/epoch_table.h"
#include "kvtransfer/transfer_metrics.h"
#include "kvtransfer/wire.h"
#include "kvtransfer/ucx/ucx_wire.h"

namespace duet::kvtransfer::ucx {


// Large segments are read in chunks so that one synchronous get (shared
// memory transports copy inside the call) never holds the worker for long.
constexpr uint64_t kChunkBytes = 8ull << 20;
// Bytes one transfer may issue per progress round, and reads it may have
// outstanding: bounds the work done under the worker lock and UCX's queues.
constexpr uint64_t kIssueBudgetBytes = 32ull << 20;
// What Pull itself issues, on the caller's thread, before the progress thread
// takes over: the first epoch reads (or a small first data read) leave at
// once instead of after a thread wake-up. Small, because shared memory
// transports copy inside ucp_get_nbx and Pull must return at once.
constexpr uint64_t kInlineIssueBytes = 64ull << 10;
constexpr int kMaxOutstandingOps = 512;
// How long a force-closed endpoint may take to hand back its reads, and how
// long an idle progress thread sleeps (keepalive runs inside progress).
constexpr absl::Duration kCloseBound = absl::Seconds(1);
constexpr absl::Duration kIdleTick = absl::Milliseconds(50);
constexpr absl::Duration kBusyTick = absl::Milliseconds(1);
// Same-host lane: process_vm_readv takes at most IOV_MAX (1024) pieces a
// call; a call copies at most kChunkBytes, so Cancel and deadlines are seen
// between calls. How often the progress thread looks at exporters' pidfds
// besides when one becomes readable.
constexpr int kMaxIov = 1024;
// A same-host copy of at least kParallelCopyBytes is split among the copy
// threads in pieces of at least kCopyTaskBytes, a few per thread so that a
// helper that wakes late still takes its share.
constexpr uint64_t kParallelCopyBytes = 1ull << 20;
constexpr uint64_t kCopyTaskBytes = 256ull << 10;
constexpr absl::Duration kPidCheck = absl::Milliseconds(100);
// Under UCX_TLS=tcp, how often the progress thread gives UCX's new sockets
// (those it accepted) their TCP_USER_TIMEOUT; Connect does it for its own.
constexpr absl::Duration kSocketCheck = absl::Milliseconds(250);
// How long Wait watches a same-host pull that another thread is copying
// before it sleeps.
constexpr absl::Duration kWaitSpin = absl::Milliseconds(5);



#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// The status of a UCX call, in UCX's own words, with a code a caller can act on.
absl::Status UcxError(ucs_status_t st, absl::string_view what);

// This process's identity, or nullopt where /proc cannot tell it.
std::optional<HostIdentity> OwnHost(const uint64_t* probe_word);
// Whether UCX_TLS (as UCX reads it: a list, or "^" and a list to leave out)
// lets intra-node memory transports run: the same-host lane counts as one.
bool TlsAllowsSameHost(absl::string_view tls);
// Whether UCX_TLS names TCP and nothing else ("tcp").
bool TlsIsTcpOnly(absl::string_view tls);
// Gives every TCP socket of this process that has SO_KEEPALIVE on and no
// TCP_USER_TIMEOUT a user timeout of its keepalive bound (TCP_KEEPIDLE +
// TCP_KEEPCNT x TCP_KEEPINTVL): Linux sends no keepalive probes on a socket
// with unacknowledged data, so without it a link cut while a read request
// or a reply is unacknowledged goes unnoticed for TCP's retransmission
// limit (about 15 minutes). UCX 1.13 sets keepalive on its TCP sockets but
// has no setting for the user timeout; duet's own sockets use no keepalive.
// Returns how many sockets it set.
int BoundKeepaliveSockets();
// Whether the process behind `pidfd` has exited (or the fd is unusable).
bool PidExited(int pidfd);
// Reads the pieces local[i] <- remote[i], i in [begin, end) (all when not
// given), of process `pid`, at most kMaxIov a call. Returns bytes read, or
// -errno; a short read is reported as -EFAULT.
int64_t ReadPeer(pid_t pid, const std::vector<struct iovec>& local, const std::vector<struct iovec>& remote,
                 size_t begin, size_t end);
int64_t ReadPeer(pid_t pid, const std::vector<struct iovec>& local, const std::vector<struct iovec>& remote);

class UcxKvTransport : public KvTransport {
 public:
  explicit UcxKvTransport(const UcxTransportOptions& options) : options_(options) {}
  ~UcxKvTransport() override;

  absl::Status Init();

  std::string Name() const override { return "ucx"; }
  std::string address() const override { return address_; }

  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t bytes,
                                          int64_t num_epoch_blocks) override;
  absl::Status DeregisterRegion(RegionId region) override;
  absl::StatusOr<std::string> ExportRegion(RegionId region) override;
  uint64_t BlockEpoch(RegionId region, int32_t block) override;
  void BumpEpoch(RegionId region, int32_t block) override;

  absl::StatusOr<PeerId> Connect(const std::string& peer_address) override;
  void Disconnect(PeerId peer) override;

  absl::StatusOr<TransferId> Pull(const PullRequest& request) override;
  std::optional<TransferResult> Poll(TransferId id) override;
  TransferResult Wait(TransferId id) override;
  void Cancel(TransferId id) override;

 private:
  struct Region {
    void* base = nullptr;
    uint64_t bytes = 0;
    ucp_mem_h memh = nullptr;
    std::string rkey;
    // The epoch table (exporters): read remotely, bumped locally. Kept
    // (mapped) until the transport dies, see Deregister.
    std::unique_ptr<EpochTable> epochs;
    ucp_mem_h epoch_memh = nullptr;
    std::string epoch_rkey;
    int local_transfers = 0;  // transfers writing into it, guarded by mu_
  };
  struct RetiredEpochs {
    std::unique_ptr<EpochTable> table;
    ucp_mem_h memh;
  };

  // Unpacked remote keys of one exported region, per endpoint.
  struct RemoteKeys {
    RegionDescriptor desc;
    ucp_rkey_h rkey = nullptr;
    ucp_rkey_h epoch_rkey = nullptr;
    ~RemoteKeys() {
      if (rkey != nullptr) ucp_rkey_destroy(rkey);
      if (epoch_rkey != nullptr) ucp_rkey_destroy(epoch_rkey);
    }
  };

  struct Peer {
    UcxKvTransport* owner = nullptr;
    PeerId id = 0;
    std::string address;  // our framed form, the key of peer_by_address_
    ucp_ep_h ep = nullptr;
    // Same-host lane: the exporter's pid and a pidfd that turns readable when
    // it exits. Such a peer has no UCX endpoint.
    bool same_host = false;
    pid_t pid = 0;
    int pidfd = -1;
    bool failed = false;
    std::string failure;
    std::map<std::string, std::shared_ptr<RemoteKeys>> keys;
    std::set<TransferId> transfers;  // not yet terminal
  };

  enum class Phase { kQueued, kEpochsBefore, kData, kEpochsAfter };

  struct Transfer {
    UcxKvTransport* owner = nullptr;
    TransferId id = 0;
    PeerId peer = 0;
    RegionId local_region = 0;
    uint8_t* local_base = nullptr;
    ucp_mem_h local_memh = nullptr;
    std::vector<Segment> segments;
    std::vector<std::pair<int32_t, uint64_t>> block_epochs;
    std::shared_ptr<RemoteKeys> keys;
    absl::Time start;
    absl::Time deadline;
    absl::Duration timeout;

    Phase phase = Phase::kQueued;
    // Issue cursor in the current phase: data = (segment, offset in it);
    // epochs = index into epoch_runs.
    size_t cursor = 0;
    uint64_t cursor_offset = 0;
    std::vector<int32_t> epoch_blocks;                // distinct, sorted
    std::vector<std::pair<size_t, size_t>> epoch_runs;  // [first, last] indexes of consecutive blocks
    std::vector<uint64_t> epochs_read;                // per epoch_blocks entry
    std::unordered_map<void*, uint64_t> requests;     // outstanding -> data bytes
    uint64_t bytes_done = 0;
    ucs_status_t error = UCS_OK;

    std::optional<TransferState> abort;  // why it stops early
    std::string abort_detail;
    absl::Time drain_deadline;
    bool forced_close = false;

    // Same-host lane: one thread at a time copies, without mu_ (busy); stop
    // asks it to end early (Cancel, Disconnect, peer lost).
    bool same_host = false;
    bool nudged = false;  // Poll asked the progress thread to copy it
    bool busy = false;
    std::atomic<bool> stop{false};

    bool finalized = false;
    bool released = false;  // region count and keys given back (drained)
    bool taken = false;
    TransferResult result;
  };

  struct Closing {
    void* request;
    absl::Time deadline;
  };

  static void OnGetDone(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  void ProgressLoop();
  void Wake();
  // mu_.Lock() that spins on TryLock for a while first: critical sections
  // are microseconds, a futex sleep and wake-up tens of them on a VM.
  void LockSpinning() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  // Every helper below runs with mu_ held, from the progress thread or an API call.
  // Issues at most `budget` bytes of reads (a progress round's worth by default).
  void Advance(Transfer* t, absl::Time now, uint64_t budget = kIssueBudgetBytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueSome(Transfer* t, uint64_t* budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasMoreToIssue(const Transfer* t) const;
  // Same-host lane: moves a transfer on by up to `budget` bytes, copying
  // with mu_ released (budget 0: only ends it if it must end). Callers must
  // look the transfer up again afterwards if they let go of it.
  void SameHostStep(Transfer* t, absl::Time now, uint64_t budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends transfers of same-host peers whose process has exited.
  void CheckSameHostPeers(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens a same-host peer: its pidfd after a probe read of its nonce.
  absl::StatusOr<int> OpenSameHost(const HostIdentity& peer);
  bool CheckEpochs(Transfer* t, bool before, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the epochs just read break the handle's promise, if they do. Reads
  // only the transfer's own fields (callable by the thread copying it).
  static std::optional<std::string> EpochMismatch(const Transfer* t, bool before);

  void OpDone(Transfer* t, void* request, ucs_status_t status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Abort(Transfer* t, TransferState state, std::string detail, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finalize(Transfer* t, TransferState state, std::string detail, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseIfDrained(Transfer* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PeerFailed(Peer* peer, std::string why, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEndpoint(Peer* peer, bool force, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollClosing(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TransferResult Take(std::map<TransferId, std::unique_ptr<Transfer>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Peer* FindPeer(PeerId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<RemoteKeys>> KeysFor(Peer* peer, const std::string& descriptor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UcxTransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  // The word a same-host peer reads to prove it reached this process.
  alignas(64) uint64_t probe_word_ = 0;
  std::optional<HostIdentity> host_;
  bool same_host_lane_ = false;  // this side reads same-host peers directly
  bool tcp_only_ = false;        // UCX_TLS=tcp: BoundKeepaliveSockets applies
  int worker_fd_ = -1;  // UCX's event fd, -1 when the worker cannot sleep on events
  int wake_fd_ = -1;    // eventfd that wakes the progress thread

  TransferMetrics metrics_{"ucx"};

  // The UCP worker and everything below: UCX runs in serialized mode under it.
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RegionId next_region_ ABSL_GUARDED_BY(mu_) = 1;
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  TransferId next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<PeerId, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PeerId> peer_by_address_ ABSL_GUARDED_BY(mu_);
  std::map<TransferId, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::set<TransferId> active_ ABSL_GUARDED_BY(mu_);  // not finalized or not drained
  std::vector<PeerId> failed_peers_ ABSL_GUARDED_BY(mu_);  // to close after progress returns
  std::vector<Closing> closing_ ABSL_GUARDED_BY(mu_);
  // Disconnected peers, kept so that a late error-handler call for their
  // (closed) endpoint never sees freed memory; bounded.
  std::vector<std::unique_ptr<Peer>> retired_peers_ ABSL_GUARDED_BY(mu_);
  std::vector<RetiredEpochs> retired_epochs_ ABSL_GUARDED_BY(mu_);
  absl::Time last_pid_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();


  // Regions, apart from mu_ so that BumpEpoch never waits for the worker.
  // Lock order: mu_ before regions_mu_.
  absl::Mutex regions_mu_;
  std::map<RegionId, std::unique_ptr<Region>> regions_ ABSL_GUARDED_BY(regions_mu_);

  std::thread progress_;
  // Copies large same-host pulls together with the thread that runs the
  // step (null: that thread copies alone).
  std::unique_ptr<ThreadPool> copy_pool_;
};

}  // namespace duet::kvtransfer::ucx

#endif  // DUET_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_

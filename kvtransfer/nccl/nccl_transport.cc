#include "kvtransfer/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/cuda_status.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/epoch_table.h"
#include "kvtransfer/nccl/nccl_wire.h"
#include "kvtransfer/transfer_record.h"

namespace duet::kvtransfer {
namespace {

using nccl::ControlMessage;
using nccl::kControlBytes;
using nccl::NcclAddress;
using nccl::NcclRegionDescriptor;
using nccl::PullHeader;
using nccl::Reply;
using nccl::ReplyKind;
using nccl::ReplyStatus;

static_assert(sizeof(ncclUniqueId) == nccl::kUniqueIdBytes);

constexpr int kExporterRank = 0;
constexpr int kImporterRank = 1;
constexpr size_t kOpsPerGroup = 256;

// The shared conversion (base/cuda_status.h), with this transport's name.
absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return ::duet::CudaStatus(err, absl::StrCat("nccl transport: ", what));
}

// NCCL's own words: the code's string and, with a communicator, its last error.
std::string NcclText(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&text, " (", last, ")");
  return text;
}

absl::Status NcclStatus(ncclResult_t r, absl::string_view what, ncclComm_t comm) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat("nccl transport: ", what, ": ", NcclText(r, comm));
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

bool AddOverflows(uint64_t a, uint64_t b, uint64_t* sum) {
  return __builtin_add_overflow(a, b, sum);
}

// Polling pause: yields first (latency of small control messages), then
// sleeps up to 1 ms so an idle serve thread costs no core. NCCL's
// asynchronous API offers no blocking wait to use instead.
class Backoff {
 public:
  void Pause() {
    if (++rounds_ < 64) {
      std::this_thread::yield();
      return;
    }
    absl::SleepFor(sleep_);
    sleep_ = std::min(sleep_ * 2, absl::Milliseconds(1));
  }

 private:
  int rounds_ = 0;
  absl::Duration sleep_ = absl::Microseconds(10);
};

// How one step on a pair's communicator ended.
struct Step {
  enum Code { kOk, kTimedOut, kStopped, kFailed };
  Code code = kOk;
  std::string detail;
  bool ok() const { return code == kOk; }
};

// One NCCL send or receive of `bytes` bytes at `ptr` (device memory).
struct Op {
  bool send = false;
  void* ptr = nullptr;
  size_t bytes = 0;
};

// One side of a pair: its communicator, a stream, and device memory to stage
// control messages in. Used by one thread at a time.
class Channel {
 public:
  Channel(int device, ncclComm_t comm, int peer_rank)
      : device_(device), comm_(comm), peer_rank_(peer_rank) {}

  absl::Status Init() {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    return Reserve(4096);
  }

  ~Channel() {
    cudaSetDevice(device_);
    Abort();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (ctl_ != nullptr) cudaFree(ctl_);
  }

  // Device staging of at least `bytes`; only between steps (stream idle).
  absl::Status Reserve(size_t bytes) {
    if (bytes <= ctl_bytes_) return absl::OkStatus();
    if (ctl_ != nullptr) cudaFree(ctl_);
    ctl_ = nullptr;
    ctl_bytes_ = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ctl_, bytes), "cudaMalloc(control buffer)"));
    ctl_bytes_ = bytes;
    return absl::OkStatus();
  }
  uint8_t* ctl() const { return static_cast<uint8_t*>(ctl_); }

  // Copies host bytes into the staging buffer, ordered before later ops.
  Step Stage(const void* host, size_t bytes, size_t offset) {
    cudaError_t err = cudaMemcpyAsync(ctl() + offset, host, bytes, cudaMemcpyHostToDevice, stream_);
    if (err != cudaSuccess) return Fail("cudaMemcpyAsync(control)", CudaErrorText(err));
    return {};
  }
  // Reads staged bytes back; the stream must be idle (after a Run).
  Step Unstage(void* host, size_t bytes, size_t offset) {
    cudaError_t err = cudaMemcpy(host, ctl() + offset, bytes, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return Fail("cudaMemcpy(control)", CudaErrorText(err));
    return {};
  }

  // Enqueues `ops` in groups and waits until the stream is idle, the
  // deadline passes or `stop` is set (both abort the communicator).
  Step Run(const std::vector<Op>& ops, absl::Time deadline, const std::atomic<bool>& stop) {
    if (aborted_) return {Step::kFailed, "the pair's communicator was aborted earlier"};
    for (size_t first = 0; first < ops.size(); first += kOpsPerGroup) {
      ncclResult_t r = ncclGroupStart();
      for (size_t i = first; i < std::min(ops.size(), first + kOpsPerGroup) && r == ncclSuccess;
           ++i) {
        const Op& op = ops[i];
        r = op.send ? ncclSend(op.ptr, op.bytes, ncclUint8, peer_rank_, comm_, stream_)
                    : ncclRecv(op.ptr, op.bytes, ncclUint8, peer_rank_, comm_, stream_);
      }
      ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      Step settled = Settle(r, deadline, stop);
      if (!settled.ok()) return settled;
    }
    return Drain(deadline, stop);
  }

  // Ends every operation of the pair; the stream is idle when it returns.
  void Abort() {
    if (comm_ == nullptr || aborted_) return;
    aborted_ = true;
    ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess) LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(r);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // NCCL kernels exit on abort.
  }

  bool aborted() const { return aborted_; }

 private:
  // A non-blocking communicator may answer ncclInProgress; the next call
  // must wait until its state leaves that.
  Step Settle(ncclResult_t r, absl::Time deadline, const std::atomic<bool>& stop) {
    Backoff backoff;
    while (r == ncclInProgress) {
      if (stop.load()) return Stop(Step::kStopped, "stopped");
      if (absl::Now() > deadline) return Stop(Step::kTimedOut, "deadline passed in NCCL enqueue");
      backoff.Pause();
      ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
      if (q != ncclSuccess) r = q;
    }
    if (r != ncclSuccess) return Fail("ncclSend/ncclRecv", NcclText(r, comm_));
    return {};
  }

  Step Drain(absl::Time deadline, const std::atomic<bool>& stop) {
    Backoff backoff;
    while (true) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) return Fail("stream", CudaErrorText(q));
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        return Fail("NCCL", NcclText(async, comm_));
      }
      if (stop.load()) return Stop(Step::kStopped, "stopped");
      if (absl::Now() > deadline) return Stop(Step::kTimedOut, "deadline passed in transfer");
      backoff.Pause();
    }
  }

  Step Fail(absl::string_view what, absl::string_view text) {
    Step s{Step::kFailed, absl::StrCat(what, ": ", text)};
    Abort();
    return s;
  }
  Step Stop(Step::Code code, std::string detail) {
    Abort();
    return {code, std::move(detail)};
  }

  const int device_;
  ncclComm_t comm_;
  const int peer_rank_;
  cudaStream_t stream_ = nullptr;
  void* ctl_ = nullptr;
  size_t ctl_bytes_ = 0;
  bool aborted_ = false;
};

// Creates a 2-rank communicator without blocking, so that a stop flag or a
// deadline can end the wait (ncclCommAbort).
absl::StatusOr<ncclComm_t> InitComm(int device, const ncclUniqueId& id, int rank,
                                    absl::Time deadline, const std::atomic<bool>& stop) {
  absl::Status status = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  if (!status.ok()) return status;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  Backoff backoff;
  while (r == ncclInProgress) {
    if (stop.load() || absl::Now() > deadline) {
      ncclCommAbort(comm);
      return stop.load() ? absl::CancelledError("nccl transport: stopped while pairing")
                         : absl::UnavailableError(
                               "nccl transport: the other rank did not join the communicator "
                               "in time (a used or stale address?)");
    }
    backoff.Pause();
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    absl::Status failed = NcclStatus(r, "ncclCommInitRankConfig", comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return failed;
  }
  return comm;
}

// An exporter's registered region: what serve threads read. Shared so that
// DeregisterRegion does not pull it from under a pull in progress.
struct ExportedRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::unique_ptr<EpochTable> epochs;
};

class NcclKvTransport final : public KvTransport {
 public:
  explicit NcclKvTransport(const NcclOptions& options)
      : options_(options), nonce_(RandomNonce()), host_(HostName()) {}

  ~NcclKvTransport() override {
    stopping_.store(true);
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<PeerId> peers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, peer] : peers_) peers.push_back(id);
    }
    for (PeerId id : peers) Disconnect(id);
    std::vector<std::unique_ptr<Session>> sessions;
    {
      absl::MutexLock lock(&mu_);
      sessions.swap(sessions_);
    }
    for (auto& s : sessions) StopSession(*s);
  }

  absl::Status Start() {
    int count = 0;
    absl::Status status = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (!status.ok()) return absl::UnavailableError(status.message());
    if (options_.device < 0 || options_.device >= count) {
      return absl::InvalidArgumentError(absl::StrCat("nccl transport: device ", options_.device,
                                                     " does not exist (", count, " visible)"));
    }
    status = CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice");
    if (!status.ok()) return status;
    if (!options_.serve) return absl::OkStatus();
    absl::StatusOr<ncclUniqueId> id = NextPairing();
    if (!id.ok()) return id.status();
    accept_thread_ = std::thread([this, first = *id] { AcceptLoop(first); });
    return absl::OkStatus();
  }

  std::string Name() const override { return "nccl"; }

  std::string address() const override {
    absl::MutexLock lock(&mu_);
    return address_;
  }

  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t bytes,
                                          int64_t num_epoch_blocks) override {
    RETURN_IF_ERROR(CheckRegisterRegion("nccl transport", base, bytes, num_epoch_blocks));
    absl::Status status = CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice");
    if (!status.ok()) return status;
    cudaPointerAttributes attr;
    status = CudaStatus(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes");
    if (!status.ok()) return status;
    if (attr.type != cudaMemoryTypeDevice) {
      return absl::InvalidArgumentError("nccl transport: RegisterRegion needs device memory");
    }
    auto region = std::make_shared<ExportedRegion>();
    region->base = static_cast<uint8_t*>(base);
    region->bytes = bytes;
    ASSIGN_OR_RETURN(region->epochs, EpochTable::Allocate(num_epoch_blocks));
    absl::MutexLock lock(&mu_);
    RegionId id = next_region_++;
    regions_.emplace(id, std::move(region));
    return id;
  }

  absl::StatusOr<std::string> ExportRegion(RegionId id) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(auto it, kvtransfer::FindRegion(regions_, id, "nccl transport"));
    if (!options_.serve) {
      return absl::FailedPreconditionError(
          "nccl transport: created with serve = false; it cannot export regions");
    }
    NcclRegionDescriptor d;
    d.transport_nonce = nonce_;
    d.region_id = id;
    d.bytes = it->second->bytes;
    d.num_epoch_blocks = it->second->epochs->num_blocks();
    return nccl::EncodeRegionDescriptor(d);
  }

  absl::Status DeregisterRegion(RegionId id) override {
    absl::MutexLock lock(&mu_);
    return EraseIdleRegion(regions_, transfers_, id, "nccl transport");
  }

  uint64_t BlockEpoch(RegionId id, int32_t block) override { return EpochsOrDie(id).Load(block); }
  void BumpEpoch(RegionId id, int32_t block) override { EpochsOrDie(id).Bump(block); }

  absl::StatusOr<PeerId> Connect(const std::string& peer_address) override {
    absl::StatusOr<NcclAddress> address = nccl::DecodeAddress(peer_address);
    if (!address.ok()) return address.status();
    ncclUniqueId id;
    std::memcpy(&id, address->unique_id.data(), sizeof(id));
    std::atomic<bool> never{false};
    absl::StatusOr<ncclComm_t> comm =
        InitComm(options_.device, id, kImporterRank, absl::Now() + options_.connect_timeout, never);
    if (!comm.ok()) {
      return absl::Status(comm.status().code(), absl::StrCat(comm.status().message(),
                                                             " [exporter on ", address->host, "]"));
    }
    auto peer = std::make_unique<Peer>();
    peer->address = *std::move(address);
    peer->channel = std::make_unique<Channel>(options_.device, *comm, kExporterRank);
    absl::Status status = peer->channel->Init();
    if (!status.ok()) return status;
    Peer* raw = peer.get();
    absl::MutexLock lock(&mu_);
    PeerId pid = next_peer_++;
    peers_.emplace(pid, std::move(peer));
    raw->worker = std::thread([this, raw] { PeerLoop(raw); });
    return pid;
  }

  void Disconnect(PeerId id) override {
    std::unique_ptr<Peer> peer;
    {
      absl::MutexLock lock(&mu_);
      auto it = peers_.find(id);
      if (it == peers_.end()) return;
      peer = std::move(it->second);
      peers_.erase(it);
      peer->closing = true;
      peer->stop.store(true);  // Aborts a running pull: it ends kCancelled.
    }
    peer->worker.join();  // The worker cancels what is still queued.
  }

  absl::StatusOr<TransferId> Pull(const PullRequest& request) override {
    absl::StatusOr<NcclRegionDescriptor> remote =
        nccl::DecodeRegionDescriptor(request.remote_region);
    if (!remote.ok()) return remote.status();
    absl::MutexLock lock(&mu_);
    auto peer_it = peers_.find(request.peer);
    if (peer_it == peers_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl transport: unknown peer ", request.peer));
    }
    Peer& peer = *peer_it->second;
    if (remote->transport_nonce != peer.address.transport_nonce) {
      return absl::InvalidArgumentError(
          "nccl transport: remote_region was exported by another transport than the peer's");
    }
    ASSIGN_OR_RETURN(auto region_it, FindPullDestination(regions_, request, "nccl transport"));
    const ExportedRegion& local = *region_it->second;
    if (request.segments.size() > nccl::kMaxSegments ||
        request.block_epochs.size() > nccl::kMaxEpochs) {
      return absl::InvalidArgumentError("nccl transport: too many segments or epochs in one pull");
    }
    ASSIGN_OR_RETURN(const uint64_t total,
                     CheckPullBounds(request, remote->bytes, local.bytes, remote->num_epoch_blocks));
    TransferId id = next_transfer_++;
    Transfer& t = transfers_[id];
    t.Begin(request, total, metrics_);
    t.remote_region_id = remote->region_id;
    t.dst_base = local.base;
    t.segments = request.segments;
    peer.queue.push_back(id);
    return id;
  }

  std::optional<TransferResult> Poll(TransferId id) override {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return UnknownTransfer("nccl transport", id);
    Transfer& t = it->second;
    if (!t.result.has_value() && !t.started && absl::Now() > t.deadline) {
      Unqueue(id, t);
      SetResult(t, TransferState::kTimedOut, "deadline passed while queued behind other pulls");
    }
    if (!t.result.has_value()) return std::nullopt;
    TransferResult result = *t.result;
    transfers_.erase(it);
    return result;
  }

  TransferResult Wait(TransferId id) override {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return UnknownTransfer("nccl transport", id);
    Transfer* t = &it->second;
    auto ended = [t] { return t->result.has_value(); };
    // A started pull is ended by its worker (by the deadline at the latest);
    // a queued one is ended here when its deadline passes.
    if (!mu_.AwaitWithDeadline(absl::Condition(&ended), t->deadline) && !t->started) {
      Unqueue(id, *t);
      SetResult(*t, TransferState::kTimedOut, "deadline passed while queued behind other pulls");
    }
    mu_.Await(absl::Condition(&ended));
    TransferResult result = *t->result;
    transfers_.erase(id);
    return result;
  }

  void Cancel(TransferId id) override {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end() || it->second.result.has_value()) return;
    Transfer& t = it->second;
    t.cancelled = true;
    if (!t.started) {
      Unqueue(id, t);
      SetResult(t, TransferState::kCancelled, "cancelled before it started");
    }
  }

 private:
  struct Transfer : TransferRecord {
    uint32_t remote_region_id = 0;
    uint8_t* dst_base = nullptr;
    std::vector<Segment> segments;
    bool started = false;
  };

  // Importer side of one pair.
  struct Peer {
    NcclAddress address;
    std::unique_ptr<Channel> channel;  // Used by `worker` only.
    std::thread worker;
    std::deque<TransferId> queue;  // Guarded by the transport's mu_.
    bool closing = false;          // Guarded by mu_.
    std::atomic<bool> stop{false};
    std::string broken;  // Why the pair is unusable; guarded by mu_.
    uint64_t next_seq = 1;
  };

  // Exporter side of one pair.
  struct Session {
    std::unique_ptr<Channel> channel;
    std::thread thread;
    std::atomic<bool> stop{false};
    std::atomic<bool> done{false};
  };

  EpochTable& EpochsOrDie(RegionId id) {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(id);
    CHECK(it != regions_.end()) << "nccl transport: unknown region " << id;
    return *it->second->epochs;
  }

  void SetResult(Transfer& t, TransferState state, std::string detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    t.End(state, std::move(detail), metrics_);
  }

  void Unqueue(TransferId id, const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto peer = peers_.find(t.peer);
    if (peer == peers_.end()) return;
    auto& q = peer->second->queue;
    q.erase(std::remove(q.begin(), q.end(), id), q.end());
  }

  // ---- Importer: one worker per peer runs its pulls in order. ----

  void PeerLoop(Peer* peer) {
    cudaSetDevice(options_.device);
    while (true) {
      TransferId id = 0;
      Transfer snapshot;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [peer] { return peer->closing || !peer->queue.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (peer->closing) {
          for (TransferId q : peer->queue) {
            auto it = transfers_.find(q);
            if (it != transfers_.end() && !it->second.result.has_value()) {
              SetResult(it->second, TransferState::kCancelled, "peer disconnected");
            }
          }
          peer->queue.clear();
          return;
        }
        id = peer->queue.front();
        peer->queue.pop_front();
        Transfer& t = transfers_.at(id);
        if (!peer->broken.empty()) {
          SetResult(t, TransferState::kPeerLost, peer->broken);
          continue;
        }
        t.started = true;
        snapshot = t;  // The worker reads its own copy outside the lock.
      }
      auto [state, detail] = RunPull(*peer, snapshot);
      absl::MutexLock lock(&mu_);
      Transfer& t = transfers_.at(id);
      if (peer->channel->aborted() && peer->broken.empty()) {
        peer->broken = absl::StrCat("the pair was dropped: ", detail);
      }
      if (t.cancelled || (state == TransferState::kCancelled)) {
        SetResult(t, TransferState::kCancelled, "cancelled while running; " + detail);
      } else {
        SetResult(t, state, detail);
      }
    }
  }

  static TransferState StateFor(const Step& step) {
    switch (step.code) {
      case Step::kOk:
        return TransferState::kDone;
      case Step::kTimedOut:
        return TransferState::kTimedOut;
      case Step::kStopped:
        return TransferState::kCancelled;
      case Step::kFailed:
        return TransferState::kPeerLost;
    }
    return TransferState::kPeerLost;
  }

  // Runs the importer half of the protocol; returns the terminal state.
  std::pair<TransferState, std::string> RunPull(Peer& peer, const Transfer& t) {
    Channel& ch = *peer.channel;
    const uint64_t seq = peer.next_seq++;
    PullHeader header;
    header.seq = seq;
    header.region_id = t.remote_region_id;
    header.num_segments = static_cast<uint32_t>(t.segments.size());
    header.num_epochs = static_cast<uint32_t>(t.block_epochs.size());
    ControlMessage head = nccl::EncodePullHeader(header);
    std::string body = nccl::EncodePullBody(t.segments, t.block_epochs);
    absl::Status reserved = ch.Reserve(kControlBytes + body.size());
    if (!reserved.ok()) return {TransferState::kPeerLost, std::string(reserved.message())};

    // 1. Header and lists.
    Step step = ch.Stage(head.data(), kControlBytes, 0);
    if (step.ok() && !body.empty()) step = ch.Stage(body.data(), body.size(), kControlBytes);
    std::vector<Op> ops = {{true, ch.ctl(), kControlBytes}};
    if (!body.empty()) ops.push_back({true, ch.ctl() + kControlBytes, body.size()});
    if (step.ok()) step = ch.Run(ops, t.deadline, peer.stop);
    if (!step.ok()) return {StateFor(step), step.detail};

    // 2. The reply: are the epochs still as promised, is the request valid?
    absl::StatusOr<Reply> reply = ReceiveReply(ch, t.deadline, peer.stop, &step);
    if (!step.ok()) return {StateFor(step), step.detail};
    if (!reply.ok() || reply->seq != seq || reply->kind != ReplyKind::kReply) {
      ch.Abort();
      return {TransferState::kPeerLost,
              absl::StrCat("the pair lost sync: ",
                           reply.ok() ? "unexpected reply" : reply.status().message())};
    }
    switch (reply->status) {
      case ReplyStatus::kOk:
        break;
      case ReplyStatus::kLeaseExpired:
        return {TransferState::kLeaseExpired, "exporter: " + reply->detail};
      case ReplyStatus::kUnknownRegion:
        return {TransferState::kLeaseExpired,
                "exporter no longer has the region: " + reply->detail};
      case ReplyStatus::kBadRequest:
        return {TransferState::kPeerLost, "exporter refused the request: " + reply->detail};
    }

    // 3. The data, straight into the destination, then the trailer.
    ops.clear();
    for (const Segment& s : t.segments) ops.push_back({false, t.dst_base + s.dst_offset, s.length});
    step = ch.Run(ops, t.deadline, peer.stop);
    if (!step.ok()) return {StateFor(step), step.detail};
    absl::StatusOr<Reply> trailer = ReceiveReply(ch, t.deadline, peer.stop, &step);
    if (!step.ok()) return {StateFor(step), step.detail};
    if (!trailer.ok() || trailer->seq != seq || trailer->kind != ReplyKind::kTrailer) {
      ch.Abort();
      return {TransferState::kPeerLost, "the pair lost sync: unexpected trailer"};
    }
    if (trailer->status != ReplyStatus::kOk) {
      return {TransferState::kLeaseExpired, "an epoch changed during the transfer"};
    }
    return {TransferState::kDone, ""};
  }

  static absl::StatusOr<Reply> ReceiveReply(Channel& ch, absl::Time deadline,
                                            const std::atomic<bool>& stop, Step* step) {
    *step = ch.Run({{false, ch.ctl(), kControlBytes}}, deadline, stop);
    if (!step->ok()) return absl::CancelledError(step->detail);
    ControlMessage message;
    *step = ch.Unstage(message.data(), kControlBytes, 0);
    if (!step->ok()) return absl::CancelledError(step->detail);
    return nccl::DecodeReply(message);
  }

  // ---- Exporter: pairing and one serve thread per importer. ----

  // A fresh unique id, published as address().
  absl::StatusOr<ncclUniqueId> NextPairing() {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclStatus(r, "ncclGetUniqueId", nullptr);
    NcclAddress a;
    a.transport_nonce = nonce_;
    a.host = host_;
    std::memcpy(a.unique_id.data(), &id, sizeof(id));
    absl::MutexLock lock(&mu_);
    a.pairing = ++pairings_;
    address_ = nccl::EncodeAddress(a);
    return id;
  }

  void AcceptLoop(ncclUniqueId id) {
    while (!stopping_.load()) {
      absl::StatusOr<ncclComm_t> comm =
          InitComm(options_.device, id, kExporterRank, absl::InfiniteFuture(), stopping_);
      if (stopping_.load()) return;
      if (comm.ok()) {
        auto session = std::make_unique<Session>();
        session->channel = std::make_unique<Channel>(options_.device, *comm, kImporterRank);
        absl::Status status = session->channel->Init();
        if (status.ok()) {
          Session* raw = session.get();
          raw->thread = std::thread([this, raw] { ServeLoop(raw); });
          std::vector<std::unique_ptr<Session>> finished;
          {
            absl::MutexLock lock(&mu_);
            for (auto& s : sessions_) {
              if (s->done.load()) finished.push_back(std::move(s));
            }
            sessions_.erase(std::remove(sessions_.begin(), sessions_.end(), nullptr),
                            sessions_.end());
            sessions_.push_back(std::move(session));
          }
          for (auto& s : finished) StopSession(*s);
        } else {
          LOG(WARNING) << "nccl transport: dropping a new pair: " << status;
        }
      } else {
        LOG(WARNING) << "nccl transport: pairing failed: " << comm.status();
      }
      absl::StatusOr<ncclUniqueId> next = NextPairing();
      if (!next.ok()) {
        LOG(ERROR) << "nccl transport: no new pairings: " << next.status();
        return;
      }
      id = *next;
    }
  }

  void StopSession(Session& s) {
    s.stop.store(true);
    if (s.thread.joinable()) s.thread.join();
    s.channel.reset();
  }

  std::shared_ptr<ExportedRegion> FindRegion(uint32_t id) {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(id);
    return it == regions_.end() ? nullptr : it->second;
  }

  void ServeLoop(Session* s) {
    cudaSetDevice(options_.device);
    Channel& ch = *s->channel;
    while (true) {
      // Wait as long as it takes for the next request.
      Step step = ch.Run({{false, ch.ctl(), kControlBytes}}, absl::InfiniteFuture(), s->stop);
      if (!step.ok()) break;
      ControlMessage message;
      if (!ch.Unstage(message.data(), kControlBytes, 0).ok()) break;
      absl::StatusOr<PullHeader> header = nccl::DecodePullHeader(message);
      if (!header.ok()) {
        LOG(WARNING) << "nccl transport: dropping a pair after a bad request header: "
                     << header.status();
        break;
      }
      if (!Serve(ch, *header, s->stop)) break;
    }
    ch.Abort();
    s->done.store(true);
  }

  // One pull, exporter side. False when the pair must be dropped.
  bool Serve(Channel& ch, const PullHeader& header, const std::atomic<bool>& stop) {
    const absl::Time deadline = absl::Now() + options_.serve_step_timeout;
    std::vector<Segment> segments;
    std::vector<std::pair<int32_t, uint64_t>> epochs;
    const uint64_t body_bytes = nccl::PullBodyBytes(header);
    if (body_bytes > 0) {
      if (!ch.Reserve(kControlBytes + body_bytes).ok()) return false;
      Step step = ch.Run({{false, ch.ctl() + kControlBytes, body_bytes}}, deadline, stop);
      if (!step.ok()) return false;
      std::string body(body_bytes, '\0');
      if (!ch.Unstage(body.data(), body_bytes, kControlBytes).ok()) return false;
      if (!nccl::DecodePullBody(body, header, &segments, &epochs).ok()) return false;
    }

    Reply reply;
    reply.seq = header.seq;
    std::shared_ptr<ExportedRegion> region = FindRegion(header.region_id);
    if (region == nullptr) {
      reply.status = ReplyStatus::kUnknownRegion;
      reply.detail = absl::StrCat("region ", header.region_id);
    } else {
      for (const Segment& s : segments) {
        uint64_t end = 0;
        if (s.length == 0 || AddOverflows(s.src_offset, s.length, &end) || end > region->bytes) {
          reply.status = ReplyStatus::kBadRequest;
          reply.detail = "segment outside the region";
        }
      }
      for (const auto& [block, epoch] : epochs) {
        if (block < 0 || block >= region->epochs->num_blocks()) {
          reply.status = ReplyStatus::kBadRequest;
          reply.detail = "epoch block outside the table";
        }
      }
      if (reply.status == ReplyStatus::kOk) {
        if (std::optional<std::string> broken = region->epochs->Broken(epochs, "before")) {
          reply.status = ReplyStatus::kLeaseExpired;
          reply.detail = std::move(*broken);
        }
      }
    }
    if (!SendReply(ch, reply, deadline, stop)) return false;
    if (reply.status != ReplyStatus::kOk) return true;

    std::vector<Op> ops;
    for (const Segment& s : segments) ops.push_back({true, region->base + s.src_offset, s.length});
    // The stream is idle after Run: every byte has left the region, so the
    // epochs read next cover the whole read, as the importer's second read
    // does in the one-sided transports.
    if (!ch.Run(ops, deadline, stop).ok()) return false;
    Reply trailer;
    trailer.kind = ReplyKind::kTrailer;
    trailer.seq = header.seq;
    if (std::optional<std::string> broken = region->epochs->Broken(epochs, "during")) {
      trailer.status = ReplyStatus::kLeaseExpired;
      trailer.detail = std::move(*broken);
    }
    return SendReply(ch, trailer, deadline, stop);
  }

  static bool SendReply(Channel& ch, const Reply& reply, absl::Time deadline,
                        const std::atomic<bool>& stop) {
    ControlMessage message = nccl::EncodeReply(reply);
    Step step = ch.Stage(message.data(), kControlBytes, 0);
    if (step.ok()) step = ch.Run({{true, ch.ctl(), kControlBytes}}, deadline, stop);
    return step.ok();
  }

  const NcclOptions options_;
  const uint64_t nonce_;
  const std::string host_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  TransferMetrics metrics_{"nccl"};

  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  uint64_t pairings_ ABSL_GUARDED_BY(mu_) = 0;
  RegionId next_region_ ABSL_GUARDED_BY(mu_) = 1;
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  TransferId next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<RegionId, std::shared_ptr<ExportedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  std::map<PeerId, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::map<TransferId, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<KvTransportPtr> NewNcclTransport(const NcclOptions& options) {
  auto transport = std::make_unique<NcclKvTransport>(options);
  absl::Status status = transport->Start();
  if (!status.ok()) return status;
  return KvTransportPtr(std::move(transport));
}

}  // namespace duet::kvtransfer

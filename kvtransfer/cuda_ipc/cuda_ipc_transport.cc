#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/cuda_status.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"
#include "kvtransfer/cuda_ipc/shm_epoch_table.h"
#include "kvtransfer/epoch_table.h"
#include "kvtransfer/transfer_record.h"

namespace duet::kvtransfer {
namespace {

using cuda_ipc::IpcAddress;
using cuda_ipc::IpcRegionDescriptor;
using cuda_ipc::SharedEpochTable;

static_assert(sizeof(cudaIpcMemHandle_t) == cuda_ipc::kIpcHandleBytes);

// The shared conversion (base/cuda_status.h), with this transport's name.
absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return ::duet::CudaStatus(err, absl::StrCat("cuda_ipc: ", what));
}

std::string ReadBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  if (!id.empty()) return id;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat("host:", host);
}

uint64_t ProcessNonce() {
  static const uint64_t nonce = RandomNonce();
  return nonce;
}

bool ProcessAlive(int32_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

bool AddOverflows(uint64_t a, uint64_t b, uint64_t* sum) {
  return __builtin_add_overflow(a, b, sum);
}

// cuMemGetAddressRange through the runtime, so that nothing links libcuda:
// a region may start inside a larger cudaMalloc, and IPC handles name whole
// allocations.
using GetAddressRangeFn = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);

// An exporter's region opened in this process; closed when the last pull
// using it has drained and the cache has dropped it.
struct Import {
  int device = 0;
  uint8_t* base = nullptr;  // Region base here.
  void* opened = nullptr;   // From cudaIpcOpenMemHandle; null for same-process.
  uint64_t bytes = 0;
  std::unique_ptr<SharedEpochTable> epochs;

  ~Import() {
    if (opened != nullptr) {
      cudaSetDevice(device);
      cudaError_t err = cudaIpcCloseMemHandle(opened);
      if (err != cudaSuccess) LOG(WARNING) << "cudaIpcCloseMemHandle: " << CudaErrorText(err);
    }
  }
};

class CudaIpcKvTransport final : public KvTransport {
 public:
  CudaIpcKvTransport(int device, cudaStream_t stream, GetAddressRangeFn get_range)
      : device_(device), stream_(stream), get_range_(get_range) {
    self_.boot_id = ReadBootId();
    self_.pid = static_cast<int32_t>(getpid());
    self_.process_nonce = ProcessNonce();
    self_.transport_nonce = RandomNonce();
    address_ = cuda_ipc::EncodeAddress(self_);
  }

  ~CudaIpcKvTransport() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // No copy may outlive the mappings below.
    absl::MutexLock lock(&mu_);
    transfers_.clear();
    imports_.clear();
    regions_.clear();
    for (cudaEvent_t e : all_events_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override { return "cuda_ipc"; }
  std::string address() const override { return address_; }

  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t bytes,
                                          int64_t num_epoch_blocks) override {
    absl::Status status = CheckRegisterRegion("cuda_ipc", base, bytes, num_epoch_blocks);
    if (!status.ok()) return status;
    status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
    if (!status.ok()) return status;
    cudaPointerAttributes attr;
    status = CudaStatus(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes");
    if (!status.ok()) return status;
    if (attr.type != cudaMemoryTypeDevice) {
      return absl::InvalidArgumentError(
          "cuda_ipc: RegisterRegion needs device memory (cudaMalloc); got host or managed memory");
    }
    unsigned long long alloc_base = 0;
    size_t alloc_size = 0;
    int cu = get_range_(&alloc_base, &alloc_size, reinterpret_cast<unsigned long long>(base));
    if (cu != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: cuMemGetAddressRange failed with CUresult ", cu));
    }
    uint64_t offset = reinterpret_cast<uint64_t>(base) - alloc_base;
    uint64_t end = 0;
    if (AddOverflows(offset, bytes, &end) || end > alloc_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: region of ", bytes, " bytes at offset ", offset,
                       " runs past its allocation of ", alloc_size, " bytes"));
    }

    absl::MutexLock lock(&mu_);
    RegionId id = next_region_++;
    Region region;
    region.base = static_cast<uint8_t*>(base);
    region.bytes = bytes;
    region.device = attr.device;
    region.allocation_base = reinterpret_cast<void*>(alloc_base);
    region.allocation_offset = offset;
    if (num_epoch_blocks > 0) {
      std::string name =
          absl::StrFormat("/duet-kv-%d-%016x-%u", self_.pid, self_.transport_nonce, id);
      absl::StatusOr<std::unique_ptr<SharedEpochTable>> table =
          SharedEpochTable::Create(name, num_epoch_blocks);
      if (!table.ok()) return table.status();
      region.epochs = std::move(table).value();
    }
    regions_.emplace(id, std::move(region));
    return id;
  }

  absl::Status DeregisterRegion(RegionId id) override {
    // Erasing a region unlinks its epoch table; importers keep their mappings.
    absl::MutexLock lock(&mu_);
    return EraseIdleRegion(regions_, transfers_, id, "cuda_ipc");
  }

  absl::StatusOr<std::string> ExportRegion(RegionId id) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(auto it, FindRegion(regions_, id, "cuda_ipc"));
    Region& region = it->second;
    if (region.descriptor.empty()) {
      absl::Status status = CudaStatus(cudaSetDevice(region.device), "cudaSetDevice");
      if (!status.ok()) return status;
      cudaIpcMemHandle_t handle;
      status =
          CudaStatus(cudaIpcGetMemHandle(&handle, region.allocation_base), "cudaIpcGetMemHandle");
      if (!status.ok()) return status;
      IpcRegionDescriptor d;
      d.transport_nonce = self_.transport_nonce;
      d.region_id = id;
      std::memcpy(d.ipc_handle.data(), &handle, sizeof(handle));
      d.allocation_offset = region.allocation_offset;
      d.bytes = region.bytes;
      d.exporter_base = reinterpret_cast<uint64_t>(region.base);
      if (region.epochs != nullptr) {
        d.epoch_shm_name = region.epochs->name();
        d.num_epoch_blocks = region.epochs->num_blocks();
      }
      region.descriptor = cuda_ipc::EncodeRegionDescriptor(d);
    }
    return region.descriptor;
  }

  uint64_t BlockEpoch(RegionId id, int32_t block) override {
    absl::MutexLock lock(&mu_);
    SharedEpochTable& table = EpochTableOrDie(id);
    return table.Load(block);
  }

  void BumpEpoch(RegionId id, int32_t block) override {
    absl::MutexLock lock(&mu_);
    EpochTableOrDie(id).Bump(block);
  }

  absl::StatusOr<PeerId> Connect(const std::string& peer_address) override {
    absl::StatusOr<IpcAddress> address = cuda_ipc::DecodeAddress(peer_address);
    if (!address.ok()) return address.status();
    if (address->boot_id != self_.boot_id) {
      return absl::FailedPreconditionError(
          "cuda_ipc: the exporter runs on another host (boot id differs); CUDA IPC is "
          "node-local, use nccl or ucx");
    }
    bool same_process = address->process_nonce == self_.process_nonce;
    if (!same_process && !ProcessAlive(address->pid)) {
      return absl::UnavailableError(
          absl::StrCat("cuda_ipc: exporter process ", address->pid, " is not running"));
    }
    absl::MutexLock lock(&mu_);
    PeerId id = next_peer_++;
    peers_.emplace(id, Peer{*std::move(address), same_process});
    return id;
  }

  void Disconnect(PeerId peer) override {
    std::vector<std::pair<TransferId, cudaEvent_t>> draining;
    {
      absl::MutexLock lock(&mu_);
      if (peers_.erase(peer) == 0) return;
      for (auto& [tid, t] : transfers_) {
        if (t.peer != peer || t.result.has_value()) continue;
        t.cancelled = true;
        draining.emplace_back(tid, t.done);
      }
      for (auto it = imports_.begin(); it != imports_.end();) {
        it = it->second.peer == peer ? imports_.erase(it) : std::next(it);
      }
    }
    cudaSetDevice(device_);
    for (auto& [tid, event] : draining) {
      cudaError_t err = cudaEventSynchronize(event);
      absl::MutexLock lock(&mu_);
      auto it = transfers_.find(tid);
      if (it != transfers_.end() && !it->second.result.has_value()) Finish(it->second, err);
    }
  }

  absl::StatusOr<TransferId> Pull(const PullRequest& request) override {
    absl::StatusOr<IpcRegionDescriptor> remote =
        cuda_ipc::DecodeRegionDescriptor(request.remote_region);
    if (!remote.ok()) return remote.status();
    absl::Status status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
    if (!status.ok()) return status;

    absl::MutexLock lock(&mu_);
    auto peer_it = peers_.find(request.peer);
    if (peer_it == peers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: unknown peer ", request.peer));
    }
    const Peer& peer = peer_it->second;
    if (remote->transport_nonce != peer.address.transport_nonce) {
      return absl::InvalidArgumentError(
          "cuda_ipc: remote_region was exported by another transport than the peer's");
    }
    ASSIGN_OR_RETURN(auto region_it, FindPullDestination(regions_, request, "cuda_ipc"));
    const Region& local = region_it->second;
    ASSIGN_OR_RETURN(const uint64_t total,
                     CheckPullBounds(request, remote->bytes, local.bytes, remote->num_epoch_blocks));

    TransferId id = next_transfer_++;
    Transfer& t = transfers_[id];
    t.Begin(request, total, metrics_);

    if (!peer.same_process && !ProcessAlive(peer.address.pid)) {
      SetResult(t, TransferState::kPeerLost,
                absl::StrCat("exporter process ", peer.address.pid, " exited"));
      return id;
    }
    absl::StatusOr<std::shared_ptr<Import>> import =
        OpenImport(request.peer, peer, request.remote_region, *remote);
    if (!import.ok()) {
      // The exporter deregistered the region or is going away: no lease
      // survives that, so this is an ending of the transfer, not a bad request.
      SetResult(t,
                import.status().code() == absl::StatusCode::kNotFound ? TransferState::kLeaseExpired
                                                                      : TransferState::kPeerLost,
                std::string(import.status().message()));
      return id;
    }
    t.import = *std::move(import);
    if (std::optional<std::string> broken = BrokenEpochs(t, "before")) {
      SetResult(t, TransferState::kLeaseExpired, std::move(*broken));
      t.import.reset();
      return id;
    }

    absl::StatusOr<cudaEvent_t> event = TakeEvent();
    if (!event.ok()) {
      metrics_.Withdrawn();
      transfers_.erase(id);
      return event.status();
    }
    t.done = *event;
    cudaError_t err = cudaSuccess;
    for (const Segment& s : request.segments) {
      err = cudaMemcpyAsync(local.base + s.dst_offset, t.import->base + s.src_offset, s.length,
                            cudaMemcpyDeviceToDevice, stream_);
      if (err != cudaSuccess) break;
    }
    // Recorded even after a failed enqueue, so the terminal state still waits
    // for the copies that did start.
    cudaError_t record = cudaEventRecord(t.done, stream_);
    if (err != cudaSuccess || record != cudaSuccess) {
      t.enqueue_error = CudaErrorText(err != cudaSuccess ? err : record);
      if (record != cudaSuccess) {
        cudaStreamSynchronize(stream_);
        SetResult(t, TransferState::kPeerLost, "cudaEventRecord: " + t.enqueue_error);
        t.import.reset();
      }
    }
    return id;
  }

  std::optional<TransferResult> Poll(TransferId id) override {
    cudaSetDevice(device_);
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return UnknownTransfer("cuda_ipc", id);
    Transfer& t = it->second;
    if (!t.result.has_value()) {
      cudaError_t q = cudaEventQuery(t.done);
      if (q == cudaErrorNotReady) {
        if (absl::Now() > t.deadline) t.timed_out = true;
        return std::nullopt;
      }
      Finish(t, q);
    }
    TransferResult result = *t.result;
    transfers_.erase(it);
    return result;
  }

  TransferResult Wait(TransferId id) override {
    cudaEvent_t event = nullptr;
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      auto it = transfers_.find(id);
      if (it == transfers_.end()) return UnknownTransfer("cuda_ipc", id);
      if (!it->second.result.has_value()) {
        event = it->second.done;
        deadline = it->second.deadline;
      }
    }
    cudaError_t err = cudaSuccess;
    if (event != nullptr) {
      cudaSetDevice(device_);
      err = cudaEventQuery(event);
      if (err == cudaErrorNotReady) {
        err = cudaEventSynchronize(event);  // Bounded by the copy (see header).
        if (absl::Now() > deadline) {
          absl::MutexLock lock(&mu_);
          auto it = transfers_.find(id);
          if (it != transfers_.end()) it->second.timed_out = true;
        }
      }
    }
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return UnknownTransfer("cuda_ipc", id);  // A racing Poll took it.
    if (!it->second.result.has_value()) Finish(it->second, err);
    TransferResult result = *it->second.result;
    transfers_.erase(it);
    return result;
  }

  void Cancel(TransferId id) override {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(id);
    if (it != transfers_.end() && !it->second.result.has_value()) it->second.cancelled = true;
  }

 private:
  struct Region {
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    int device = 0;
    void* allocation_base = nullptr;
    uint64_t allocation_offset = 0;
    std::unique_ptr<SharedEpochTable> epochs;  // Exporters only.
    std::string descriptor;                    // Built by the first ExportRegion.
  };

  struct Peer {
    IpcAddress address;
    bool same_process = false;
  };

  struct CachedImport {
    PeerId peer = 0;
    std::shared_ptr<Import> import;
  };

  struct Transfer : TransferRecord {
    std::shared_ptr<Import> import;  // Held until the copies have drained.
    cudaEvent_t done = nullptr;      // Null when it ended before any copy.
    bool timed_out = false;          // Seen still running after its deadline.
    std::string enqueue_error;
  };

  SharedEpochTable& EpochTableOrDie(RegionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = regions_.find(id);
    CHECK(it != regions_.end()) << "cuda_ipc: unknown region " << id;
    CHECK(it->second.epochs != nullptr) << "cuda_ipc: region " << id << " has no epoch table";
    return *it->second.epochs;
  }

  absl::StatusOr<std::shared_ptr<Import>> OpenImport(PeerId peer_id, const Peer& peer,
                                                     const std::string& key,
                                                     const IpcRegionDescriptor& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto cached = imports_.find(key);
    if (cached != imports_.end()) return cached->second.import;
    auto import = std::make_shared<Import>();
    import->device = device_;
    import->bytes = d.bytes;
    if (d.num_epoch_blocks > 0) {
      absl::StatusOr<std::unique_ptr<SharedEpochTable>> table =
          SharedEpochTable::Open(d.epoch_shm_name, d.num_epoch_blocks);
      if (!table.ok()) return table.status();
      import->epochs = *std::move(table);
    }
    if (peer.same_process) {
      // cudaIpcOpenMemHandle refuses handles of its own process; the pointer is valid here.
      import->base = reinterpret_cast<uint8_t*>(d.exporter_base);
    } else {
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, d.ipc_handle.data(), sizeof(handle));
      void* opened = nullptr;
      absl::Status status =
          CudaStatus(cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle");
      if (!status.ok()) return absl::UnavailableError(status.message());
      import->opened = opened;
      import->base = static_cast<uint8_t*>(opened) + d.allocation_offset;
    }
    imports_.emplace(key, CachedImport{peer_id, import});
    return import;
  }

  static std::optional<std::string> BrokenEpochs(const Transfer& t, absl::string_view when) {
    if (t.block_epochs.empty()) return std::nullopt;
    if (t.import->epochs == nullptr) return "the exporter's region has no epoch table";
    return t.import->epochs->table().Broken(t.block_epochs, when);
  }

  absl::StatusOr<cudaEvent_t> TakeEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    absl::Status status =
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync),
                   "cudaEventCreateWithFlags");
    if (!status.ok()) return status;
    all_events_.push_back(e);
    return e;
  }

  void SetResult(Transfer& t, TransferState state, std::string detail) {
    t.End(state, std::move(detail), metrics_);
  }

  // The copies of `t` have drained (event_status is the event's, cudaSuccess
  // or an error). Decides the terminal state and releases the mapping.
  void Finish(Transfer& t, cudaError_t event_status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (t.done != nullptr) free_events_.push_back(t.done);
    auto peer = peers_.find(t.peer);
    if (t.cancelled) {
      SetResult(t, TransferState::kCancelled, "cancelled");
    } else if (event_status != cudaSuccess) {
      SetResult(t, TransferState::kPeerLost, "copy failed: " + CudaErrorText(event_status));
    } else if (!t.enqueue_error.empty()) {
      SetResult(t, TransferState::kPeerLost, "cudaMemcpyAsync: " + t.enqueue_error);
    } else if (t.timed_out) {
      SetResult(t, TransferState::kTimedOut, "copy still running at the deadline");
    } else if (std::optional<std::string> broken = BrokenEpochs(t, "during")) {
      SetResult(t, TransferState::kLeaseExpired, std::move(*broken));
    } else if (peer != peers_.end() && !peer->second.same_process &&
               !ProcessAlive(peer->second.address.pid)) {
      SetResult(t, TransferState::kPeerLost, "exporter process exited during the copy");
    } else {
      SetResult(t, TransferState::kDone, "");
    }
    t.import.reset();
  }

  const int device_;
  const cudaStream_t stream_;
  TransferMetrics metrics_{"cuda_ipc"};
  const GetAddressRangeFn get_range_;
  IpcAddress self_;
  std::string address_;

  absl::Mutex mu_;
  RegionId next_region_ ABSL_GUARDED_BY(mu_) = 1;
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  TransferId next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<RegionId, Region> regions_ ABSL_GUARDED_BY(mu_);
  std::map<PeerId, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CachedImport> imports_ ABSL_GUARDED_BY(mu_);  // By descriptor bytes.
  std::map<TransferId, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> all_events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<KvTransportPtr> NewCudaIpcTransport(const CudaIpcOptions& options) {
  int count = 0;
  absl::Status status = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!status.ok()) return absl::UnavailableError(status.message());
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc: device ", options.device, " does not exist (", count, " visible)"));
  }
  status = CudaStatus(cudaSetDevice(options.device), "cudaSetDevice");
  if (!status.ok()) return status;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  status = CudaStatus(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                       cudaEnableDefault, &found),
                      "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
  if (!status.ok()) return status;
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::UnavailableError("cuda_ipc: the driver has no cuMemGetAddressRange");
  }
  cudaStream_t stream = nullptr;
  status = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  if (!status.ok()) return status;
  return KvTransportPtr(
      new CudaIpcKvTransport(options.device, stream, reinterpret_cast<GetAddressRangeFn>(fn)));
}

}  // namespace duet::kvtransfer

#include "kvtransfer/loopback/loopback_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kvtransfer/epoch_table.h"
#include "kvtransfer/transfer_metrics.h"
#include "kvtransfer/wire.h"

namespace duet::kvtransfer {
namespace {

constexpr uint32_t kAddressMagic = 0x414c4b44;  // "DKLA"
constexpr uint32_t kRegionMagic = 0x524c4b44;   // "DKLR"
constexpr uint16_t kWireVersion = 1;

struct Region {
  void* base = nullptr;
  uint64_t bytes = 0;
  std::unique_ptr<EpochTable> epochs;
  // Readers: copies in progress. Writer: deregistration, which sets `dead`.
  absl::Mutex use_mu;
  bool dead ABSL_GUARDED_BY(use_mu) = false;
};

// What a transport shares with the registry and its peers: its regions.
struct State {
  uint64_t uid = 0;
  std::string name;
  absl::Mutex mu;
  std::map<RegionId, std::shared_ptr<Region>> regions ABSL_GUARDED_BY(mu);
};

absl::Mutex registry_mu(absl::kConstInit);
std::map<std::string, std::weak_ptr<State>>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* r = new std::map<std::string, std::weak_ptr<State>>();
  return *r;
}
std::atomic<uint64_t> next_uid{1};

struct Descriptor {
  uint64_t uid = 0;
  uint32_t region = 0;
  uint64_t length = 0;
  uint64_t num_epochs = 0;
};

absl::StatusOr<Descriptor> DecodeRegion(absl::string_view bytes) {
  ByteReader r(bytes);
  uint32_t magic;
  uint16_t version, flags;
  Descriptor d;
  if (!r.U32(&magic) || magic != kRegionMagic) {
    return absl::InvalidArgumentError("remote region: not a loopback region descriptor (bad magic)");
  }
  if (!r.U16(&version) || version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote region: unsupported descriptor version ", version));
  }
  if (!r.U16(&flags) || !r.U64(&d.uid) || !r.U32(&d.region) || !r.U64(&d.length) ||
      !r.U64(&d.num_epochs) || !r.done()) {
    return absl::InvalidArgumentError("remote region: truncated or oversized descriptor");
  }
  return d;
}

absl::StatusOr<std::string> DecodeAddress(absl::string_view bytes) {
  ByteReader r(bytes);
  uint32_t magic;
  uint16_t version, flags;
  std::string name;
  if (!r.U32(&magic) || magic != kAddressMagic || !r.U16(&version) || version != kWireVersion ||
      !r.U16(&flags) || !r.Blob(&name, 256) || !r.done()) {
    return absl::InvalidArgumentError("peer address: not a loopback transport address");
  }
  return name;
}

class LoopbackKvTransport : public KvTransport {
 public:
  explicit LoopbackKvTransport(LoopbackOptions options) : options_(std::move(options)) {
    state_ = std::make_shared<State>();
    state_->uid = next_uid.fetch_add(1);
    state_->name = absl::StrCat("loopback:", getpid(), ":", state_->uid);
    ByteWriter w;
    w.U32(kAddressMagic);
    w.U16(kWireVersion);
    w.U16(0);
    w.Blob(state_->name);
    address_ = w.Take();
    {
      absl::MutexLock lock(&registry_mu);
      Registry()[state_->name] = state_;
    }
  }

  ~LoopbackKvTransport() override {
    {
      absl::MutexLock lock(&registry_mu);
      Registry().erase(state_->name);
    }
    // Peers that already hold our state may be copying: wait for them
    // (without state_->mu: a copy's test hook may take it).
    std::map<RegionId, std::shared_ptr<Region>> regions;
    {
      absl::MutexLock lock(&state_->mu);
      regions.swap(state_->regions);
    }
    for (auto& [id, r] : regions) {
      absl::MutexLock use(&r->use_mu);
      r->dead = true;
    }
  }

  std::string Name() const override { return "loopback"; }
  std::string address() const override { return address_; }

  absl::StatusOr<RegionId> RegisterRegion(void* base, uint64_t bytes,
                                          int64_t num_epoch_blocks) override {
    RETURN_IF_ERROR(CheckRegisterRegion("loopback", base, bytes, num_epoch_blocks));
    auto r = std::make_shared<Region>();
    r->base = base;
    r->bytes = bytes;
    ASSIGN_OR_RETURN(r->epochs, EpochTable::Allocate(num_epoch_blocks));
    absl::MutexLock lock(&state_->mu);
    RegionId id = next_region_++;
    state_->regions[id] = std::move(r);
    return id;
  }

  absl::Status DeregisterRegion(RegionId region) override {
    std::shared_ptr<Region> r;
    {
      absl::MutexLock lock(&state_->mu);
      auto it = state_->regions.find(region);
      if (it == state_->regions.end()) {
        return absl::NotFoundError(absl::StrCat("DeregisterRegion: unknown region ", region));
      }
      r = it->second;
      state_->regions.erase(it);
    }
    absl::MutexLock use(&r->use_mu);  // waits for copies in progress
    r->dead = true;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ExportRegion(RegionId region) override {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->regions.find(region);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("ExportRegion: unknown region ", region));
    }
    ByteWriter w;
    w.U32(kRegionMagic);
    w.U16(kWireVersion);
    w.U16(0);
    w.U64(state_->uid);
    w.U32(region);
    w.U64(it->second->bytes);
    w.U64(static_cast<uint64_t>(it->second->epochs->num_blocks()));
    return w.Take();
  }

  uint64_t BlockEpoch(RegionId region, int32_t block) override {
    return EpochsOf(region)->epochs->Load(block);
  }

  void BumpEpoch(RegionId region, int32_t block) override {
    EpochsOf(region)->epochs->Bump(block);
  }

  absl::StatusOr<PeerId> Connect(const std::string& peer_address) override {
    ASSIGN_OR_RETURN(std::string name, DecodeAddress(peer_address));
    {
      absl::MutexLock lock(&registry_mu);
      auto it = Registry().find(name);
      if (it == Registry().end() || it->second.expired()) {
        return absl::UnavailableError(absl::StrCat("no loopback transport named ", name));
      }
    }
    absl::MutexLock lock(&mu_);
    for (const auto& [id, n] : peers_) {
      if (n == name) return id;
    }
    PeerId id = next_peer_++;
    peers_[id] = name;
    return id;
  }

  void Disconnect(PeerId peer) override {
    absl::MutexLock lock(&mu_);
    peers_.erase(peer);
  }

  absl::StatusOr<TransferId> Pull(const PullRequest& request) override;

  std::optional<TransferResult> Poll(TransferId id) override { return Take(id); }
  TransferResult Wait(TransferId id) override { return Take(id); }
  void Cancel(TransferId) override {}  // every pull has already ended

 private:
  std::shared_ptr<Region> EpochsOf(RegionId region) {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->regions.find(region);
    CHECK(it != state_->regions.end()) << "unknown region " << region;
    return it->second;
  }

  TransferResult Take(TransferId id) {
    absl::MutexLock lock(&mu_);
    auto it = results_.find(id);
    if (it == results_.end()) return UnknownTransfer("loopback", id);
    TransferResult r = std::move(it->second);
    results_.erase(it);
    return r;
  }

  TransferId Finish(TransferResult r, absl::Time start) {
    r.duration = absl::Now() - start;
    metrics_.Started();  // A loopback pull is copied in the call: it starts and ends here.
    metrics_.Record(r);
    absl::MutexLock lock(&mu_);
    TransferId id = next_transfer_++;
    results_[id] = std::move(r);
    return id;
  }

  const LoopbackOptions options_;
  std::shared_ptr<State> state_;
  std::string address_;
  TransferMetrics metrics_{"loopback"};

  absl::Mutex mu_;
  RegionId next_region_ = 1;  // guarded by state_->mu
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  TransferId next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<PeerId, std::string> peers_ ABSL_GUARDED_BY(mu_);
  std::map<TransferId, TransferResult> results_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<TransferId> LoopbackKvTransport::Pull(const PullRequest& request) {
  absl::Time start = absl::Now();
  std::string peer_name;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(request.peer);
    if (it == peers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("Pull: unknown peer ", request.peer));
    }
    peer_name = it->second;
  }
  std::shared_ptr<Region> local;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->regions.find(request.local_region);
    if (it == state_->regions.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: unknown local region ", request.local_region));
    }
    local = it->second;
  }
  ASSIGN_OR_RETURN(Descriptor desc, DecodeRegion(request.remote_region));
  RETURN_IF_ERROR(CheckPullBounds(request, desc.length, local->bytes, desc.num_epochs).status());

  TransferResult result;
  std::shared_ptr<State> remote;
  {
    absl::MutexLock lock(&registry_mu);
    auto it = Registry().find(peer_name);
    if (it != Registry().end()) remote = it->second.lock();
  }
  if (remote == nullptr) {
    result.state = TransferState::kPeerLost;
    result.detail = "peer lost: its transport is gone";
    return Finish(result, start);
  }
  if (remote->uid != desc.uid) {
    return absl::InvalidArgumentError("Pull: the region descriptor belongs to another transport");
  }
  if (request.timeout <= absl::ZeroDuration()) {
    result.state = TransferState::kTimedOut;
    result.detail = absl::StrCat("not finished within ", absl::FormatDuration(request.timeout));
    return Finish(result, start);
  }
  std::shared_ptr<Region> src;
  {
    absl::MutexLock lock(&remote->mu);
    auto it = remote->regions.find(desc.region);
    if (it != remote->regions.end()) src = it->second;
  }
  // Reader locks keep both regions registered while we copy: taken in
  // address order (two transports may pull from each other), once when a
  // transport pulls from its own region.
  std::vector<absl::Mutex*> locks = {&local->use_mu};
  if (src != nullptr && src != local) locks.push_back(&src->use_mu);
  std::sort(locks.begin(), locks.end());
  std::optional<absl::ReaderMutexLock> first, second;
  first.emplace(locks[0]);
  if (locks.size() > 1) second.emplace(locks[1]);
  if (src == nullptr || src->dead || local->dead) {
    // A deregistered region is what a stale handle names after its lease.
    result.state = TransferState::kLeaseExpired;
    result.detail = "the remote region was deregistered";
    return Finish(result, start);
  }
  auto check = [&](const char* when) {
    std::optional<std::string> broken = src->epochs->Broken(request.block_epochs, when);
    if (!broken) return true;
    result.state = TransferState::kLeaseExpired;
    result.detail = std::move(*broken);
    return false;
  };
  if (!check("before")) return Finish(result, start);
  for (const Segment& s : request.segments) {
    std::memmove(static_cast<uint8_t*>(local->base) + s.dst_offset,
                 static_cast<const uint8_t*>(src->base) + s.src_offset, s.length);
    result.bytes += s.length;
  }
  if (options_.during_pull) options_.during_pull();
  if (!check("during")) return Finish(result, start);
  result.state = TransferState::kDone;
  return Finish(result, start);
}

}  // namespace

KvTransportPtr NewLoopbackTransport(LoopbackOptions options) {
  return std::make_unique<LoopbackKvTransport>(std::move(options));
}

}  // namespace duet::kvtransfer

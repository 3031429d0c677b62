#include "kvtransfer/ucx/ucx_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/wire.h"

namespace duet::kvtransfer::ucx {

std::string EncodeRegion(const RegionDescriptor& d) {
  ByteWriter w;
  w.U32(kRegionMagic);
  w.U16(kWireVersion);
  w.U16(0);  // flags, none yet
  w.U64(d.base);
  w.U64(d.length);
  w.Blob(d.rkey);
  w.U64(d.epoch_base);
  w.U64(d.num_epochs);
  w.Blob(d.epoch_rkey);
  return w.Take();
}

absl::StatusOr<RegionDescriptor> DecodeRegion(absl::string_view bytes) {
  ByteReader r(bytes);
  RegionDescriptor d;
  uint32_t magic;
  uint16_t version = 0, flags = 0;
  if (!r.U32(&magic) || magic != kRegionMagic) {
    return absl::InvalidArgumentError("remote region: not a UCX region descriptor (bad magic)");
  }
  if (!r.U16(&version)) return absl::InvalidArgumentError("remote region: truncated descriptor");
  if (version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote region: unsupported descriptor version ", version));
  }
  if (!r.U16(&flags) || !r.U64(&d.base) || !r.U64(&d.length) || !r.Blob(&d.rkey, kMaxKeyBytes) ||
      !r.U64(&d.epoch_base) || !r.U64(&d.num_epochs) || !r.Blob(&d.epoch_rkey, kMaxKeyBytes) ||
      !r.done()) {
    return absl::InvalidArgumentError("remote region: truncated or oversized descriptor");
  }
  if (d.length == 0 || d.rkey.empty() || d.base + d.length < d.base) {
    return absl::InvalidArgumentError("remote region: empty region or address overflow");
  }
  if (d.num_epochs > (uint64_t{1} << 40) ||
      (d.num_epochs > 0) != !d.epoch_rkey.empty() || (d.num_epochs > 0 && d.epoch_base == 0)) {
    return absl::InvalidArgumentError("remote region: inconsistent epoch table");
  }
  return d;
}



std::string EncodeAddress(const void* worker_address, size_t length,
                          const std::optional<HostIdentity>& host) {
  ByteWriter w;
  w.U32(kAddressMagic);
  w.U16(kAddressVersion);
  w.U16(host ? kAddressHasHost : 0);
  w.Blob(absl::string_view(static_cast<const char*>(worker_address), length));
  if (host) {
    w.Blob(host->boot_id);
    w.U64(host->pid_namespace);
    w.U32(host->pid);
    w.U64(host->probe_address);
    w.U64(host->nonce);
  }
  return w.Take();
}

absl::StatusOr<PeerAddress> DecodeAddress(absl::string_view bytes) {
  ByteReader r(bytes);
  uint32_t magic;
  uint16_t version = 0, flags = 0;
  PeerAddress a;
  if (!r.U32(&magic) || magic != kAddressMagic) {
    return absl::InvalidArgumentError("peer address: not a UCX transport address (bad magic)");
  }
  if (!r.U16(&version)) return absl::InvalidArgumentError("peer address: truncated");
  if (version != kAddressVersion) {
    return absl::InvalidArgumentError(absl::StrCat("peer address: unsupported version ", version));
  }
  if (!r.U16(&flags) || !r.Blob(&a.worker_address, kMaxWorkerAddressBytes) ||
      a.worker_address.empty() || (flags & ~kAddressHasHost) != 0) {
    return absl::InvalidArgumentError("peer address: truncated or malformed");
  }
  if (flags & kAddressHasHost) {
    HostIdentity h;
    if (!r.Blob(&h.boot_id, 64) || !r.U64(&h.pid_namespace) || !r.U32(&h.pid) ||
        !r.U64(&h.probe_address) || !r.U64(&h.nonce) || h.pid == 0) {
      return absl::InvalidArgumentError("peer address: truncated or malformed host section");
    }
    a.host = std::move(h);
  }
  if (!r.done()) return absl::InvalidArgumentError("peer address: truncated or malformed");
  return a;
}

}  // namespace duet::kvtransfer::ucx

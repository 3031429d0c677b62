#include "kvtransfer/cuda_ipc/ipc_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "kvtransfer/wire.h"

namespace duet::kvtransfer::cuda_ipc {
namespace {

constexpr RecordFormat kFormat{"cuda_ipc", "a cuda_ipc record", 0x49434b44 /* "DKCI" */, kIpcWireVersion};
constexpr uint16_t kKindAddress = 1;
constexpr uint16_t kKindRegion = 2;
constexpr uint32_t kMaxBootIdBytes = 64;

absl::Status Malformed(absl::string_view what, absl::string_view why) { return kFormat.Malformed(what, why); }

}  // namespace

absl::Status ValidateShmName(absl::string_view name) {
  if (name.size() < 2 || name.size() > kMaxShmNameBytes || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name must be '/' and 1..", kMaxShmNameBytes - 1, " characters"));
  }
  for (char c : name.substr(1)) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return absl::InvalidArgumentError("shm name has a character outside [A-Za-z0-9._-]");
  }
  return absl::OkStatus();
}

std::string EncodeAddress(const IpcAddress& address) {
  ByteWriter w = kFormat.Start(kKindAddress);
  w.Blob(address.boot_id);
  w.U32(static_cast<uint32_t>(address.pid));
  w.U64(address.process_nonce);
  w.U64(address.transport_nonce);
  return w.Take();
}

absl::StatusOr<IpcAddress> DecodeAddress(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "address";
  ByteReader r(bytes);
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, kKindAddress));
  IpcAddress a;
  uint32_t pid = 0;
  if (!r.Blob(&a.boot_id, kMaxBootIdBytes) || !r.U32(&pid) || !r.U64(&a.process_nonce) ||
      !r.U64(&a.transport_nonce)) {
    return Malformed(kWhat, "truncated or oversized field");
  }
  if (!r.done()) return Malformed(kWhat, "trailing bytes");
  a.pid = static_cast<int32_t>(pid);
  if (a.boot_id.empty()) return Malformed(kWhat, "empty boot id");
  if (a.pid <= 0) return Malformed(kWhat, absl::StrCat("bad pid ", a.pid));
  return a;
}

std::string EncodeRegionDescriptor(const IpcRegionDescriptor& d) {
  ByteWriter w = kFormat.Start(kKindRegion);
  w.U64(d.transport_nonce);
  w.U32(d.region_id);
  w.Blob(
      absl::string_view(reinterpret_cast<const char*>(d.ipc_handle.data()), d.ipc_handle.size()));
  w.U64(d.allocation_offset);
  w.U64(d.bytes);
  w.U64(d.exporter_base);
  w.Blob(d.epoch_shm_name);
  w.U64(static_cast<uint64_t>(d.num_epoch_blocks));
  return w.Take();
}

absl::StatusOr<IpcRegionDescriptor> DecodeRegionDescriptor(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "region descriptor";
  ByteReader r(bytes);
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, kKindRegion));
  IpcRegionDescriptor d;
  std::string handle;
  uint64_t num_blocks = 0;
  if (!r.U64(&d.transport_nonce) || !r.U32(&d.region_id) || !r.Blob(&handle, kIpcHandleBytes) ||
      !r.U64(&d.allocation_offset) || !r.U64(&d.bytes) || !r.U64(&d.exporter_base) ||
      !r.Blob(&d.epoch_shm_name, kMaxShmNameBytes) || !r.U64(&num_blocks)) {
    return Malformed(kWhat, "truncated or oversized field");
  }
  if (!r.done()) return Malformed(kWhat, "trailing bytes");
  if (handle.size() != kIpcHandleBytes) {
    return Malformed(
        kWhat, absl::StrCat("IPC handle of ", handle.size(), " bytes, want ", kIpcHandleBytes));
  }
  std::memcpy(d.ipc_handle.data(), handle.data(), kIpcHandleBytes);
  d.num_epoch_blocks = static_cast<int64_t>(num_blocks);
  if (d.bytes == 0) return Malformed(kWhat, "empty region");
  if (d.num_epoch_blocks < 0) return Malformed(kWhat, "negative epoch block count");
  if (d.epoch_shm_name.empty() != (d.num_epoch_blocks == 0)) {
    return Malformed(kWhat, "epoch table name and block count disagree");
  }
  if (!d.epoch_shm_name.empty()) {
    absl::Status name = ValidateShmName(d.epoch_shm_name);
    if (!name.ok()) return Malformed(kWhat, name.message());
  }
  return d;
}

}  // namespace duet::kvtransfer::cuda_ipc

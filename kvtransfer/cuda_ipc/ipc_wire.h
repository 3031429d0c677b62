// Wire formats of the CUDA IPC transport: the address an importer passes to
// Connect, and the region descriptor ExportRegion returns. Pure bytes, no
// CUDA: the descriptor carries the cudaIpcMemHandle_t as 64 opaque bytes.
//
//   std::string bytes = EncodeRegionDescriptor(descriptor);   // exporter
//   ASSIGN_OR_RETURN(IpcRegionDescriptor d, DecodeRegionDescriptor(bytes));  // importer
//
// Both formats start with a magic, a kind and a version and are validated in
// full on decode (InvalidArgument names the first thing wrong), so a
// descriptor from another transport, a newer version or a truncated message
// is refused instead of being mapped. Thread-safe: pure functions.
#ifndef DUET_KVTRANSFER_CUDA_IPC_IPC_WIRE_H_
#define DUET_KVTRANSFER_CUDA_IPC_IPC_WIRE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::kvtransfer::cuda_ipc {

inline constexpr uint16_t kIpcWireVersion = 1;
// sizeof(cudaIpcMemHandle_t); cuda_ipc_transport.cc static_asserts it.
inline constexpr size_t kIpcHandleBytes = 64;
// Longest POSIX shared-memory name we produce or accept (NAME_MAX is 255).
inline constexpr size_t kMaxShmNameBytes = 200;

// Who an exporter is. CUDA IPC only works between processes of one host, so
// the importer compares boot ids; pid + nonces tell processes and transport
// instances apart (a pid can be reused, a 64-bit random nonce practically not).
struct IpcAddress {
  std::string boot_id;           // /proc/sys/kernel/random/boot_id of the host.
  int32_t pid = 0;               // The exporter's process (liveness checks).
  uint64_t process_nonce = 0;    // Random per process: "same process" test.
  uint64_t transport_nonce = 0;  // Random per transport instance.

  friend bool operator==(const IpcAddress&, const IpcAddress&) = default;
};

std::string EncodeAddress(const IpcAddress& address);
absl::StatusOr<IpcAddress> DecodeAddress(absl::string_view bytes);

// One registered device region of an exporter.
struct IpcRegionDescriptor {
  uint64_t transport_nonce = 0;  // Must match the connected peer's address.
  uint32_t region_id = 0;
  std::array<uint8_t, kIpcHandleBytes> ipc_handle{};  // Of the whole allocation.
  uint64_t allocation_offset = 0;                     // Region base minus allocation base.
  uint64_t bytes = 0;
  uint64_t exporter_base = 0;  // Region base in the exporter (same-process pulls).
  std::string epoch_shm_name;  // POSIX shm name of the epoch table; empty: none.
  int64_t num_epoch_blocks = 0;

  friend bool operator==(const IpcRegionDescriptor&, const IpcRegionDescriptor&) = default;
};

std::string EncodeRegionDescriptor(const IpcRegionDescriptor& descriptor);
absl::StatusOr<IpcRegionDescriptor> DecodeRegionDescriptor(absl::string_view bytes);

// InvalidArgument unless `name` is a portable POSIX shm name: "/" then 1..199
// of [A-Za-z0-9._-].
absl::Status ValidateShmName(absl::string_view name);

}  // namespace duet::kvtransfer::cuda_ipc

#endif  // DUET_KVTRANSFER_CUDA_IPC_IPC_WIRE_H_

// The UCX transport's wire records: the address a peer passes to Connect
// (the UCP worker's address and, for the same-host lane, who the process is
// on its host) and the descriptor of an exported region (its base, length
// and rkey, and its epoch table's). Versioned and validated (STYLE rule 10):
// a malformed record is InvalidArgument, never a crash. Internal to
// kvtransfer/ucx.
//
//   std::string bytes = EncodeRegion(d);
//   ASSIGN_OR_RETURN(RegionDescriptor back, DecodeRegion(bytes));
#ifndef DUET_KVTRANSFER_UCX_UCX_WIRE_H_
#define DUET_KVTRANSFER_UCX_UCX_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::kvtransfer::ucx {

constexpr uint32_t kAddressMagic = 0x41564b44;  // "DKVA" in memory order
constexpr uint32_t kRegionMagic = 0x52564b44;   // "DKVR"
constexpr uint16_t kWireVersion = 1;
// Addresses: version 2 adds the host section (same-host lane).
constexpr uint16_t kAddressVersion = 2;
constexpr uint16_t kAddressHasHost = 1;  // address flag
constexpr uint32_t kMaxKeyBytes = 1 << 16;
constexpr uint32_t kMaxWorkerAddressBytes = 1 << 20;

struct RegionDescriptor {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;
  uint64_t epoch_base = 0;
  uint64_t num_epochs = 0;
  std::string epoch_rkey;
};

// Who a process is on its host: a peer with the same boot id and PID
// namespace can be read with process_vm_readv. The probe word holds a random
// nonce, so a reused pid is never taken for the exporter.
struct HostIdentity {
  std::string boot_id;
  uint64_t pid_namespace = 0;
  uint32_t pid = 0;
  uint64_t probe_address = 0;
  uint64_t nonce = 0;
};

struct PeerAddress {
  std::string worker_address;
  std::optional<HostIdentity> host;
};

std::string EncodeRegion(const RegionDescriptor& d);
absl::StatusOr<RegionDescriptor> DecodeRegion(absl::string_view bytes);

std::string EncodeAddress(const void* worker_address, size_t length, const std::optional<HostIdentity>& host);
absl::StatusOr<PeerAddress> DecodeAddress(absl::string_view bytes);

}  // namespace duet::kvtransfer::ucx

#endif  // DUET_KVTRANSFER_UCX_UCX_WIRE_H_

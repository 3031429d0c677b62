// Wire formats of the NCCL transport, with no NCCL or CUDA in them so that
// they are tested on any machine: the address an importer Connects to, the
// region descriptor ExportRegion returns, and the fixed-size control
// messages the two ranks of a pair exchange over NCCL itself (see
// nccl_transport.h for the protocol).
//
//   std::array<uint8_t, kControlBytes> h = EncodePullHeader(header);   // importer
//   ASSIGN_OR_RETURN(PullHeader got, DecodePullHeader(h));             // exporter
//
// Everything is little-endian, starts with a magic, a kind and a version,
// and is validated in full on decode (InvalidArgument names what is wrong).
// Thread-safe: pure functions.
#ifndef DUET_KVTRANSFER_NCCL_NCCL_WIRE_H_
#define DUET_KVTRANSFER_NCCL_NCCL_WIRE_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/layout.h"

namespace duet::kvtransfer::nccl {

inline constexpr uint16_t kNcclWireVersion = 1;
inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES (static_assert'ed).
// Every control message on the data channel is exactly this long, so the
// exporter can post its receive before knowing what comes.
inline constexpr size_t kControlBytes = 64;
inline constexpr uint32_t kMaxSegments = 1 << 20;
inline constexpr uint32_t kMaxEpochs = 1 << 20;
inline constexpr size_t kMaxDetailBytes = 40;

struct NcclAddress {
  uint64_t transport_nonce = 0;                     // Random per exporter transport.
  uint64_t pairing = 0;                             // Which of its unique ids (one per importer).
  std::array<uint8_t, kUniqueIdBytes> unique_id{};  // The ncclUniqueId.
  std::string host;                                 // For messages only.

  friend bool operator==(const NcclAddress&, const NcclAddress&) = default;
};

std::string EncodeAddress(const NcclAddress& address);
absl::StatusOr<NcclAddress> DecodeAddress(absl::string_view bytes);

struct NcclRegionDescriptor {
  uint64_t transport_nonce = 0;  // Must match the connected peer's.
  uint32_t region_id = 0;
  uint64_t bytes = 0;
  int64_t num_epoch_blocks = 0;

  friend bool operator==(const NcclRegionDescriptor&, const NcclRegionDescriptor&) = default;
};

std::string EncodeRegionDescriptor(const NcclRegionDescriptor& descriptor);
absl::StatusOr<NcclRegionDescriptor> DecodeRegionDescriptor(absl::string_view bytes);

using ControlMessage = std::array<uint8_t, kControlBytes>;

// Importer -> exporter: a pull of `num_segments` segments from region
// `region_id`, promising `num_epochs` block epochs. The lists follow in one
// message of PullBodyBytes() bytes (none when both counts are 0).
struct PullHeader {
  uint64_t seq = 0;
  uint32_t region_id = 0;
  uint32_t num_segments = 0;
  uint32_t num_epochs = 0;

  friend bool operator==(const PullHeader&, const PullHeader&) = default;
};

ControlMessage EncodePullHeader(const PullHeader& header);
// InvalidArgument for a bad magic/kind/version or counts over the limits;
// the exporter then cannot trust the channel and drops the pair.
absl::StatusOr<PullHeader> DecodePullHeader(const ControlMessage& message);

uint64_t PullBodyBytes(const PullHeader& header);
std::string EncodePullBody(const std::vector<Segment>& segments,
                           const std::vector<std::pair<int32_t, uint64_t>>& block_epochs);
absl::Status DecodePullBody(absl::string_view body, const PullHeader& header,
                            std::vector<Segment>* segments,
                            std::vector<std::pair<int32_t, uint64_t>>* block_epochs);

// Exporter -> importer, twice per accepted pull: the reply before the data
// (kOk: the segments follow) and the trailer after it (kOk: the epochs still
// held once the data had left the region).
enum class ReplyStatus : uint32_t {
  kOk = 0,
  kLeaseExpired = 1,   // A promised epoch differs.
  kUnknownRegion = 2,  // Not (or no longer) registered.
  kBadRequest = 3,     // Out of bounds or malformed lists; the pair stays usable.
};
enum class ReplyKind : uint16_t { kReply = 1, kTrailer = 2 };

struct Reply {
  ReplyKind kind = ReplyKind::kReply;
  uint64_t seq = 0;  // The pull's; a mismatch means the pair lost sync.
  ReplyStatus status = ReplyStatus::kOk;
  std::string detail;  // At most kMaxDetailBytes (longer is cut).

  friend bool operator==(const Reply&, const Reply&) = default;
};

ControlMessage EncodeReply(const Reply& reply);
absl::StatusOr<Reply> DecodeReply(const ControlMessage& message);

}  // namespace duet::kvtransfer::nccl

#endif  // DUET_KVTRANSFER_NCCL_NCCL_WIRE_H_

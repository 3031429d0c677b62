#include "kvtransfer/nccl/nccl_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvtransfer/wire.h"

namespace duet::kvtransfer::nccl {
namespace {

constexpr RecordFormat kFormat{"nccl", "an nccl record", 0x434e4b44 /* "DKNC" */, kNcclWireVersion};
enum Kind : uint16_t {
  kKindAddress = 1,
  kKindRegion = 2,
  kKindPullHeader = 3,
  kKindReply = 4,
  kKindTrailer = 5,
};
constexpr uint32_t kMaxHostBytes = 255;
constexpr uint64_t kSegmentWireBytes = 24;  // src, dst, length.
constexpr uint64_t kEpochWireBytes = 16;    // block (u64), epoch.

absl::Status Malformed(absl::string_view what, absl::string_view why) { return kFormat.Malformed(what, why); }

ControlMessage Pad(const std::string& bytes) {
  ControlMessage m{};
  std::memcpy(m.data(), bytes.data(), std::min(bytes.size(), m.size()));
  return m;
}

absl::string_view View(const ControlMessage& m) {
  return absl::string_view(reinterpret_cast<const char*>(m.data()), m.size());
}

}  // namespace

std::string EncodeAddress(const NcclAddress& a) {
  ByteWriter w = kFormat.Start(kKindAddress);
  w.U64(a.transport_nonce);
  w.U64(a.pairing);
  w.Blob(absl::string_view(reinterpret_cast<const char*>(a.unique_id.data()), a.unique_id.size()));
  w.Blob(a.host.substr(0, kMaxHostBytes));
  return w.Take();
}

absl::StatusOr<NcclAddress> DecodeAddress(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "address";
  ByteReader r(bytes);
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, kKindAddress));
  NcclAddress a;
  std::string id;
  if (!r.U64(&a.transport_nonce) || !r.U64(&a.pairing) || !r.Blob(&id, kUniqueIdBytes) ||
      !r.Blob(&a.host, kMaxHostBytes)) {
    return Malformed(kWhat, "truncated or oversized field");
  }
  if (!r.done()) return Malformed(kWhat, "trailing bytes");
  if (id.size() != kUniqueIdBytes) {
    return Malformed(kWhat,
                     absl::StrCat("unique id of ", id.size(), " bytes, want ", kUniqueIdBytes));
  }
  std::memcpy(a.unique_id.data(), id.data(), kUniqueIdBytes);
  return a;
}

std::string EncodeRegionDescriptor(const NcclRegionDescriptor& d) {
  ByteWriter w = kFormat.Start(kKindRegion);
  w.U64(d.transport_nonce);
  w.U32(d.region_id);
  w.U64(d.bytes);
  w.U64(static_cast<uint64_t>(d.num_epoch_blocks));
  return w.Take();
}

absl::StatusOr<NcclRegionDescriptor> DecodeRegionDescriptor(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "region descriptor";
  ByteReader r(bytes);
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, kKindRegion));
  NcclRegionDescriptor d;
  uint64_t blocks = 0;
  if (!r.U64(&d.transport_nonce) || !r.U32(&d.region_id) || !r.U64(&d.bytes) || !r.U64(&blocks)) {
    return Malformed(kWhat, "truncated field");
  }
  if (!r.done()) return Malformed(kWhat, "trailing bytes");
  d.num_epoch_blocks = static_cast<int64_t>(blocks);
  if (d.bytes == 0) return Malformed(kWhat, "empty region");
  if (d.num_epoch_blocks < 0) return Malformed(kWhat, "negative epoch block count");
  return d;
}

ControlMessage EncodePullHeader(const PullHeader& h) {
  ByteWriter w = kFormat.Start(kKindPullHeader);
  w.U64(h.seq);
  w.U32(h.region_id);
  w.U32(h.num_segments);
  w.U32(h.num_epochs);
  return Pad(w.Take());
}

absl::StatusOr<PullHeader> DecodePullHeader(const ControlMessage& message) {
  constexpr absl::string_view kWhat = "pull header";
  ByteReader r(View(message));
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, kKindPullHeader));
  PullHeader h;
  if (!r.U64(&h.seq) || !r.U32(&h.region_id) || !r.U32(&h.num_segments) || !r.U32(&h.num_epochs)) {
    return Malformed(kWhat, "truncated");
  }
  if (h.num_segments > kMaxSegments || h.num_epochs > kMaxEpochs) {
    return Malformed(
        kWhat, absl::StrCat(h.num_segments, " segments and ", h.num_epochs,
                            " epochs exceed the limits (", kMaxSegments, ", ", kMaxEpochs, ")"));
  }
  return h;
}

uint64_t PullBodyBytes(const PullHeader& h) {
  return h.num_segments * kSegmentWireBytes + h.num_epochs * kEpochWireBytes;
}

std::string EncodePullBody(const std::vector<Segment>& segments,
                           const std::vector<std::pair<int32_t, uint64_t>>& block_epochs) {
  ByteWriter w;
  for (const Segment& s : segments) {
    w.U64(s.src_offset);
    w.U64(s.dst_offset);
    w.U64(s.length);
  }
  for (const auto& [block, epoch] : block_epochs) {
    w.U64(static_cast<uint64_t>(static_cast<int64_t>(block)));
    w.U64(epoch);
  }
  return w.Take();
}

absl::Status DecodePullBody(absl::string_view body, const PullHeader& h,
                            std::vector<Segment>* segments,
                            std::vector<std::pair<int32_t, uint64_t>>* block_epochs) {
  constexpr absl::string_view kWhat = "pull body";
  if (body.size() != PullBodyBytes(h)) {
    return Malformed(kWhat, absl::StrCat(body.size(), " bytes, want ", PullBodyBytes(h)));
  }
  ByteReader r(body);
  segments->assign(h.num_segments, Segment{});
  for (Segment& s : *segments) {
    if (!r.U64(&s.src_offset) || !r.U64(&s.dst_offset) || !r.U64(&s.length)) {
      return Malformed(kWhat, "truncated segment");
    }
  }
  block_epochs->clear();
  for (uint32_t i = 0; i < h.num_epochs; ++i) {
    uint64_t block = 0, epoch = 0;
    if (!r.U64(&block) || !r.U64(&epoch)) return Malformed(kWhat, "truncated epoch");
    int64_t b = static_cast<int64_t>(block);
    if (b < INT32_MIN || b > INT32_MAX) return Malformed(kWhat, "block id out of range");
    block_epochs->emplace_back(static_cast<int32_t>(b), epoch);
  }
  return absl::OkStatus();
}

ControlMessage EncodeReply(const Reply& reply) {
  ByteWriter w = kFormat.Start(reply.kind == ReplyKind::kTrailer ? kKindTrailer : kKindReply);
  w.U64(reply.seq);
  w.U32(static_cast<uint32_t>(reply.status));
  w.Blob(reply.detail.substr(0, kMaxDetailBytes));
  return Pad(w.Take());
}

absl::StatusOr<Reply> DecodeReply(const ControlMessage& message) {
  constexpr absl::string_view kWhat = "reply";
  ByteReader r(View(message));
  uint16_t kind = 0;
  RETURN_IF_ERROR(kFormat.ReadHeader(r, kWhat, &kind));
  if (kind != kKindReply && kind != kKindTrailer) {
    return Malformed(kWhat, absl::StrCat("record of kind ", kind, ", want a reply or trailer"));
  }
  Reply reply;
  reply.kind = kind == kKindTrailer ? ReplyKind::kTrailer : ReplyKind::kReply;
  uint32_t code = 0;
  if (!r.U64(&reply.seq) || !r.U32(&code) || !r.Blob(&reply.detail, kMaxDetailBytes)) {
    return Malformed(kWhat, "truncated");
  }
  if (code > static_cast<uint32_t>(ReplyStatus::kBadRequest)) {
    return Malformed(kWhat, absl::StrCat("unknown status ", code));
  }
  reply.status = static_cast<ReplyStatus>(code);
  return reply;
}

}  // namespace duet::kvtransfer::nccl

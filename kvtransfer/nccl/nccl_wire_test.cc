// The NCCL transport's wire formats, testable without a GPU or NCCL.
#include "kvtransfer/nccl/nccl_wire.h"

#include <string>

#include <catch2/catch.hpp>

namespace duet::kvtransfer::nccl {
namespace {

NcclAddress SampleAddress() {
  NcclAddress a;
  a.transport_nonce = 0xabcdef0123456789ULL;
  a.pairing = 3;
  for (size_t i = 0; i < a.unique_id.size(); ++i) a.unique_id[i] = static_cast<uint8_t>(255 - i);
  a.host = "prefill-7";
  return a;
}

TEST_CASE("nccl_wire round-trips addresses and descriptors") {
  NcclAddress a = SampleAddress();
  absl::StatusOr<NcclAddress> a2 = DecodeAddress(EncodeAddress(a));
  REQUIRE(a2.ok());
  REQUIRE(*a2 == a);

  NcclRegionDescriptor d{a.transport_nonce, 4, 1 << 26, 256};
  absl::StatusOr<NcclRegionDescriptor> d2 = DecodeRegionDescriptor(EncodeRegionDescriptor(d));
  REQUIRE(d2.ok());
  REQUIRE(*d2 == d);

  std::string bytes = EncodeAddress(a);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    REQUIRE(DecodeAddress(bytes.substr(0, n)).status().code() ==
            absl::StatusCode::kInvalidArgument);
  }
  REQUIRE(!DecodeAddress(bytes + "!").ok());
  REQUIRE(!DecodeRegionDescriptor(bytes).ok());  // An address is not a descriptor.
  std::string future = EncodeRegionDescriptor(d);
  future[6] = 9;  // Version.
  REQUIRE(DecodeRegionDescriptor(future).status().message().find("unsupported version 9") !=
          std::string::npos);
  d.bytes = 0;
  REQUIRE(!DecodeRegionDescriptor(EncodeRegionDescriptor(d)).ok());
}

TEST_CASE("nccl_wire control messages are 64 bytes and validated") {
  PullHeader h{42, 3, 5, 2};
  ControlMessage m = EncodePullHeader(h);
  absl::StatusOr<PullHeader> h2 = DecodePullHeader(m);
  REQUIRE(h2.ok());
  REQUIRE(*h2 == h);

  ControlMessage zero{};
  REQUIRE(DecodePullHeader(zero).status().code() == absl::StatusCode::kInvalidArgument);
  PullHeader huge{1, 1, kMaxSegments + 1, 0};
  REQUIRE(!DecodePullHeader(EncodePullHeader(huge)).ok());

  Reply reply{ReplyKind::kReply, 42, ReplyStatus::kLeaseExpired, "block 5"};
  absl::StatusOr<Reply> r2 = DecodeReply(EncodeReply(reply));
  REQUIRE(r2.ok());
  REQUIRE(*r2 == reply);
  Reply trailer{ReplyKind::kTrailer, 43, ReplyStatus::kOk, std::string(100, 'x')};
  r2 = DecodeReply(EncodeReply(trailer));
  REQUIRE(r2.ok());
  REQUIRE(r2->kind == ReplyKind::kTrailer);
  REQUIRE(r2->detail == std::string(kMaxDetailBytes, 'x'));  // Cut to fit 64 bytes.
  REQUIRE(!DecodeReply(m).ok());  // A pull header is not a reply.
  ControlMessage bad_status = EncodeReply(reply);
  bad_status[16] = 99;  // The status field after magic, kind, version and seq.
  REQUIRE(!DecodeReply(bad_status).ok());
}

TEST_CASE("nccl_wire pull bodies carry segments and epochs") {
  std::vector<Segment> segments = {{0, 4096, 512}, {1 << 20, 0, 4096}};
  std::vector<std::pair<int32_t, uint64_t>> epochs = {{0, 7}, {255, 1}, {-1, 0}};
  PullHeader h{1, 1, 2, 3};
  std::string body = EncodePullBody(segments, epochs);
  REQUIRE(body.size() == PullBodyBytes(h));
  std::vector<Segment> s2;
  std::vector<std::pair<int32_t, uint64_t>> e2;
  REQUIRE(DecodePullBody(body, h, &s2, &e2).ok());
  REQUIRE(s2 == segments);
  REQUIRE(e2 == epochs);
  REQUIRE(DecodePullBody(body.substr(1), h, &s2, &e2).code() ==
          absl::StatusCode::kInvalidArgument);
  PullHeader fewer{1, 1, 1, 3};
  REQUIRE(!DecodePullBody(body, fewer, &s2, &e2).ok());
}

}  // namespace
}  // namespace duet::kvtransfer::nccl

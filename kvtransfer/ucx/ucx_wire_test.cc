#include "kvtransfer/ucx/ucx_wire.h"

#include <catch2/catch.hpp>
#include <string>

namespace duet::kvtransfer::ucx {
namespace {

TEST_CASE("a region descriptor round-trips, and a damaged one is refused", "[ucx][wire]") {
  RegionDescriptor d{.base = 0x7f0000001000, .length = 393216, .rkey = std::string("rk\0ey", 5),
                     .epoch_base = 0x7f0000200000, .num_epochs = 64, .epoch_rkey = "erkey"};
  const std::string bytes = EncodeRegion(d);
  absl::StatusOr<RegionDescriptor> back = DecodeRegion(bytes);
  REQUIRE(back.ok());
  CHECK(back->base == d.base);
  CHECK(back->length == d.length);
  CHECK(back->rkey == d.rkey);
  CHECK(back->epoch_base == d.epoch_base);
  CHECK(back->num_epochs == d.num_epochs);
  CHECK(back->epoch_rkey == d.epoch_rkey);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    INFO("truncated to " << cut << " bytes");
    CHECK(DecodeRegion(bytes.substr(0, cut)).status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(!DecodeRegion(bytes + "x").ok());
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  CHECK(!DecodeRegion(bad_magic).ok());
}

TEST_CASE("an address round-trips with and without its host section", "[ucx][wire]") {
  const std::string worker = "ucp-worker-address";
  HostIdentity h{.boot_id = "3f2c", .pid_namespace = 4026531836, .pid = 4242, .probe_address = 0x1000, .nonce = 99};
  for (const std::optional<HostIdentity>& host : {std::optional<HostIdentity>(), std::optional<HostIdentity>(h)}) {
    const std::string bytes = EncodeAddress(worker.data(), worker.size(), host);
    absl::StatusOr<PeerAddress> a = DecodeAddress(bytes);
    REQUIRE(a.ok());
    CHECK(a->worker_address == worker);
    REQUIRE(a->host.has_value() == host.has_value());
    if (host) {
      CHECK(a->host->boot_id == h.boot_id);
      CHECK(a->host->pid_namespace == h.pid_namespace);
      CHECK(a->host->pid == h.pid);
      CHECK(a->host->probe_address == h.probe_address);
      CHECK(a->host->nonce == h.nonce);
    }
    for (size_t cut = 0; cut < bytes.size(); ++cut) CHECK(!DecodeAddress(bytes.substr(0, cut)).ok());
  }
  CHECK(DecodeAddress(EncodeAddress("", 0, std::nullopt)).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::kvtransfer::ucx

// The CUDA IPC transport's host-side parts, testable without a GPU: its wire
// formats, the shared-memory epoch table, and the peer-process helper the
// GPU tests rely on.
#include "kvtransfer/cuda_ipc/ipc_wire.h"

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_ipc/shm_epoch_table.h"

namespace duet::kvtransfer::cuda_ipc {
namespace {

IpcRegionDescriptor SampleDescriptor() {
  IpcRegionDescriptor d;
  d.transport_nonce = 0x0123456789abcdefULL;
  d.region_id = 7;
  for (size_t i = 0; i < d.ipc_handle.size(); ++i) d.ipc_handle[i] = static_cast<uint8_t>(i * 3);
  d.allocation_offset = 4096;
  d.bytes = 1 << 20;
  d.exporter_base = 0x7f0000001000ULL;
  d.epoch_shm_name = "/duet-kv-42-0123456789abcdef-7";
  d.num_epoch_blocks = 64;
  return d;
}

std::string UniqueShmName(const std::string& tag) {
  return absl::StrCat("/duet-test-", getpid(), "-", tag);
}

TEST_CASE("ipc_wire round-trips addresses and descriptors") {
  IpcAddress a{"0b5f6f0e-8c1e-4d7e-9f1a-2b3c4d5e6f70", 1234, 99, 0xfeedULL};
  absl::StatusOr<IpcAddress> back = DecodeAddress(EncodeAddress(a));
  REQUIRE(back.ok());
  REQUIRE(*back == a);

  IpcRegionDescriptor d = SampleDescriptor();
  absl::StatusOr<IpcRegionDescriptor> d2 = DecodeRegionDescriptor(EncodeRegionDescriptor(d));
  REQUIRE(d2.ok());
  REQUIRE(*d2 == d);

  d.epoch_shm_name.clear();
  d.num_epoch_blocks = 0;
  d2 = DecodeRegionDescriptor(EncodeRegionDescriptor(d));
  REQUIRE(d2.ok());
  REQUIRE(*d2 == d);
}

TEST_CASE("ipc_wire refuses truncated, extended, mistyped and future messages") {
  std::string good = EncodeRegionDescriptor(SampleDescriptor());
  for (size_t n = 0; n < good.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    REQUIRE(DecodeRegionDescriptor(good.substr(0, n)).status().code() ==
            absl::StatusCode::kInvalidArgument);
  }
  REQUIRE(!DecodeRegionDescriptor(good + "x").ok());

  std::string future = good;
  future[6] = 2;  // Version: little-endian u16 after the u32 magic and u16 kind.
  absl::Status status = DecodeRegionDescriptor(future).status();
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(status.message().find("unsupported version 2") != std::string::npos);

  // An address is not a descriptor, and vice versa.
  std::string address = EncodeAddress({"boot", 1, 2, 3});
  REQUIRE(!DecodeRegionDescriptor(address).ok());
  REQUIRE(!DecodeAddress(good).ok());
  REQUIRE(!DecodeAddress("").ok());

  IpcRegionDescriptor d = SampleDescriptor();
  d.epoch_shm_name = "/../../etc/passwd";
  REQUIRE(!DecodeRegionDescriptor(EncodeRegionDescriptor(d)).ok());
  d = SampleDescriptor();
  d.num_epoch_blocks = 0;  // A name without blocks.
  REQUIRE(!DecodeRegionDescriptor(EncodeRegionDescriptor(d)).ok());
  d = SampleDescriptor();
  d.bytes = 0;
  REQUIRE(!DecodeRegionDescriptor(EncodeRegionDescriptor(d)).ok());
  REQUIRE(!DecodeAddress(EncodeAddress({"boot", -5, 2, 3})).ok());
}

TEST_CASE("SharedEpochTable is shared between the exporter and a reader process") {
  const std::string name = UniqueShmName("epochs");
  absl::StatusOr<std::unique_ptr<SharedEpochTable>> table = SharedEpochTable::Create(name, 16);
  REQUIRE(table.ok());
  REQUIRE(SharedEpochTable::Create(name, 16).status().code() ==
          absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::unique_ptr<SharedEpochTable>> view = SharedEpochTable::Open(name, 16);
  REQUIRE(view.ok());
  REQUIRE((*view)->Load(3) == 0);
  (*table)->Bump(3);
  (*table)->Bump(3);
  REQUIRE((*view)->Load(3) == 2);
  REQUIRE((*view)->Load(4) == 0);

  // Another process sees the bumps (it maps the same segment by name).
  (*table)->Bump(9);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto other = SharedEpochTable::Open(name, 16);
    _exit(other.ok() && (*other)->Load(9) == 1 && (*other)->Load(3) == 2 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  REQUIRE(SharedEpochTable::Open(name, 17).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(SharedEpochTable::Open(UniqueShmName("missing"), 16).status().code() ==
          absl::StatusCode::kNotFound);
  REQUIRE(SharedEpochTable::Create("no-slash", 4).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(SharedEpochTable::Create(UniqueShmName("empty"), 0).status().code() ==
          absl::StatusCode::kInvalidArgument);

  // The owner unlinks the name; a reader keeps its mapping.
  table->reset();
  REQUIRE(SharedEpochTable::Open(name, 16).status().code() == absl::StatusCode::kNotFound);
  REQUIRE((*view)->Load(3) == 2);
}

}  // namespace
}  // namespace duet::kvtransfer::cuda_ipc

#include "kernels/buffer.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <numeric>
#include <vector>

namespace duet::kernels {
namespace {

TEST_CASE("a host buffer starts zeroed, is page-aligned and moves bytes only through its copies", "[kernels]") {
  BufferType& host = HostMemoryType();
  CHECK(host.Name() == "host");
  CHECK(host.IsHost());
  absl::StatusOr<BufferPtr> made = host.Allocate(10000, "kv pool");
  REQUIRE(made.ok());
  Buffer& b = **made;
  CHECK(b.bytes() == 10000);
  CHECK(&b.type() == &host);
  CHECK(reinterpret_cast<uintptr_t>(b.base()) % 4096 == 0);
  std::vector<uint8_t> all(10000, 7);
  REQUIRE(b.Read(0, all.data(), 10000).ok());
  CHECK(all == std::vector<uint8_t>(10000, 0));

  std::vector<uint8_t> in(300);
  std::iota(in.begin(), in.end(), 0);
  REQUIRE(b.Write(9700, in.data(), 300).ok());  // up to the last byte
  REQUIRE(b.Fill(100, 50, 0xab).ok());
  std::vector<uint8_t> out(300);
  REQUIRE(b.Read(9700, out.data(), 300).ok());
  CHECK(out == in);
  REQUIRE(b.Read(99, out.data(), 52).ok());
  CHECK(out[0] == 0);
  CHECK(out[1] == 0xab);
  CHECK(out[50] == 0xab);
  CHECK(out[51] == 0);

  // A copy within the buffer, and from another host buffer.
  REQUIRE(b.CopyFrom(b, 9700, 0, 300).ok());
  REQUIRE(b.Read(0, out.data(), 300).ok());
  CHECK(out == in);
  absl::StatusOr<BufferPtr> other = host.Allocate(64, "staging");
  REQUIRE(other.ok());
  REQUIRE((*other)->CopyFrom(b, 10, 0, 64).ok());
  std::vector<uint8_t> got(64);
  REQUIRE((*other)->Read(0, got.data(), 64).ok());
  CHECK(got == std::vector<uint8_t>(in.begin() + 10, in.begin() + 74));
}

TEST_CASE("a range outside a buffer is refused by every copy, naming the buffer", "[kernels]") {
  absl::StatusOr<BufferPtr> b = HostMemoryType().Allocate(100, "kv pool");
  REQUIRE(b.ok());
  std::vector<uint8_t> host(200);
  absl::Status s = (*b)->Write(90, host.data(), 11);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "bytes [90, 90 + 11) are outside kv pool (100 bytes)");
  CHECK(!(*b)->Read(-1, host.data(), 1).ok());
  CHECK(!(*b)->Fill(0, 101, 0).ok());
  CHECK(!(*b)->Read(INT64_MAX, host.data(), 2).ok());  // offset + bytes overflows
  CHECK(!(*b)->CopyFrom(**b, 0, 60, 50).ok());          // the destination runs past the end
  CHECK((*b)->Write(100, host.data(), 0).ok());         // an empty range at the end
  CHECK(HostMemoryType().Allocate(0, "empty").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::kernels

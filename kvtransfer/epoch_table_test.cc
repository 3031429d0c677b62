#include "kvtransfer/epoch_table.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

namespace duet::kvtransfer {
namespace {

TEST_CASE("an allocated table starts at 0, is aligned and padded, and bumps one block or all", "[kvtransfer]") {
  absl::StatusOr<std::unique_ptr<EpochTable>> t = EpochTable::Allocate(9);
  REQUIRE(t.ok());
  EpochTable& e = **t;
  CHECK(reinterpret_cast<uintptr_t>(e.words()) % 64 == 0);
  CHECK(e.bytes() == 128);  // 9 words = 72 bytes, padded to 64's multiple
  CHECK(e.num_blocks() == 9);
  for (int b = 0; b < 9; ++b) CHECK(e.Load(b) == 0);
  e.Bump(4);
  e.Bump(4);
  CHECK(e.Load(4) == 2);
  CHECK(e.Load(3) == 0);
  e.BumpAll();
  CHECK(e.Load(4) == 3);
  CHECK(e.Load(8) == 1);
}

TEST_CASE("a pull's promises hold until a promised block's epoch moves; the first broken one is named",
          "[kvtransfer]") {
  std::vector<uint64_t> words(4, 0);
  EpochTable e(words.data(), 4);  // over words the test owns
  const std::vector<std::pair<int32_t, uint64_t>> promises = {{1, 0}, {3, 0}};
  CHECK(!e.Broken(promises, "before").has_value());
  e.Bump(2);  // not promised
  CHECK(!e.Broken(promises, "before").has_value());
  e.Bump(3);
  CHECK(words[3] == 1);
  std::optional<std::string> broken = e.Broken(promises, "during");
  REQUIRE(broken.has_value());
  CHECK(*broken == "block 3 is at epoch 1, the handle promised 0 (lease ended during the pull)");
}

TEST_CASE("RegisterRegion's arguments: an empty region or a bad epoch count is refused, named by transport",
          "[kvtransfer]") {
  char byte = 0;
  CHECK(CheckRegisterRegion("ucx", &byte, 1, 0).ok());
  CHECK(CheckRegisterRegion("ucx", &byte, 1, int64_t{1} << 31).ok());
  absl::Status s = CheckRegisterRegion("ucx", nullptr, 1, 0);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "ucx: RegisterRegion: empty region");
  CHECK(CheckRegisterRegion("loopback", &byte, 0, 0).message() == "loopback: RegisterRegion: empty region");
  CHECK(CheckRegisterRegion("nccl", &byte, 1, -1).message() == "nccl: RegisterRegion: bad epoch block count -1");
  CHECK(!CheckRegisterRegion("nccl", &byte, 1, (int64_t{1} << 31) + 1).ok());
}

}  // namespace
}  // namespace duet::kvtransfer

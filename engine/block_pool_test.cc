#include "engine/block_pool.h"

#include <catch2/catch.hpp>
#include <memory>
#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace duet::engine {
namespace {

const kernels::KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .block_size = 4, .head_dim = 8};

TEST_CASE("allocation is all-or-nothing and fails with ResourceExhausted", "[block_pool]") {
  BlockPool pool(kLayout, 5);
  auto a = pool.Allocate(3);
  REQUIRE(a.ok());
  REQUIRE(std::set<int32_t>(a->begin(), a->end()).size() == 3);
  REQUIRE(pool.num_free() == 2);
  auto b = pool.Allocate(3);
  REQUIRE(b.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(pool.num_free() == 2);
  for (int32_t x : *a) pool.Unref(x);
  REQUIRE(pool.num_free() == 5);
}

TEST_CASE("sequences reserve by tokens and return blocks when destroyed", "[block_pool]") {
  BlockPool pool(kLayout, 6);
  {
    SequenceKv s(&pool);
    REQUIRE(s.Reserve(1).ok());
    REQUIRE(s.block_table().size() == 1);
    REQUIRE(s.Reserve(4).ok());
    REQUIRE(s.block_table().size() == 1);
    REQUIRE(s.Reserve(9).ok());
    REQUIRE(s.block_table().size() == 3);
    REQUIRE(s.capacity_tokens() == 12);
    SequenceKv t(&pool);
    auto st = t.Reserve(13);  // 4 more blocks; only 3 free.
    REQUIRE(st.code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(t.block_table().empty());
    REQUIRE(pool.num_free() == 3);
  }
  REQUIRE(pool.num_free() == 6);
}

TEST_CASE("shared prefixes hold blocks by reference until the last owner ends", "[block_pool]") {
  BlockPool pool(kLayout, 8);
  auto a = std::make_unique<SequenceKv>(&pool);
  REQUIRE(a->Reserve(10).ok());  // 3 blocks
  SequenceKv b(&pool);
  REQUIRE(b.SharePrefix(*a, 6).code() == absl::StatusCode::kInvalidArgument);  // not block-aligned
  REQUIRE(b.SharePrefix(*a, 8).ok());
  REQUIRE(b.block_table().size() == 2);
  REQUIRE(pool.RefCount(a->block_table()[0]) == 2);
  REQUIRE(pool.RefCount(a->block_table()[2]) == 1);
  REQUIRE(b.Reserve(12).ok());
  REQUIRE(b.block_table()[2] != a->block_table()[2]);
  REQUIRE(pool.num_free() == 4);
  const int32_t shared = a->block_table()[0];
  a.reset();
  REQUIRE(pool.RefCount(shared) == 1);
  REQUIRE(pool.num_free() == 5);
  b.Release();
  REQUIRE(pool.num_free() == 8);
}

TEST_CASE("moving a sequence moves its blocks, never frees them twice", "[block_pool]") {
  BlockPool pool(kLayout, 4);
  SequenceKv a(&pool);
  REQUIRE(a.Reserve(8).ok());
  SequenceKv b = std::move(a);
  REQUIRE(b.block_table().size() == 2);
  REQUIRE(pool.num_free() == 2);
  SequenceKv c(&pool);
  REQUIRE(c.Reserve(4).ok());
  c = std::move(b);  // c's own block returns, b's two move in.
  REQUIRE(pool.num_free() == 2);
  c.Release();
  REQUIRE(pool.num_free() == 4);
}

TEST_CASE("the layout puts one block in one contiguous region", "[block_pool]") {
  REQUIRE(kLayout.BlockStride() == 2 * 2 * 2 * 4 * 8);
  REQUIRE(kLayout.Offset(1, 0, 0, 0, 0) == kLayout.BlockStride());
  REQUIRE(kLayout.Offset(0, 1, 0, 0, 0) == 2 * 2 * 4 * 8);
  REQUIRE(kLayout.Offset(0, 0, 1, 0, 0) == 2 * 4 * 8);
  REQUIRE(kLayout.Offset(0, 0, 0, 1, 3) == 4 * 8 + 3 * 8);
  REQUIRE(BlockPool::BlocksForBytes(kLayout, kLayout.BlockStride() * 4 * 10 + 7) == 10);
}

// Memory the host addresses but a pool must treat as a device's (IsHost
// false), as the CUDA backend's is.
class DeviceLikeBuffer final : public kernels::HostAddressedBuffer {
 public:
  DeviceLikeBuffer(const kernels::BufferType* type, int64_t bytes, std::string name)
      : type_(type), bytes_(static_cast<size_t>(bytes), 0), name_(std::move(name)) {}
  const kernels::BufferType& type() const override { return *type_; }
  int64_t bytes() const override { return static_cast<int64_t>(bytes_.size()); }
  const std::string& name() const override { return name_; }
  void* base() const override { return const_cast<uint8_t*>(bytes_.data()); }

 private:
  const kernels::BufferType* type_;
  std::vector<uint8_t> bytes_;
  std::string name_;
};

class DeviceLikeType final : public kernels::BufferType {
 public:
  std::string Name() const override { return "device-like"; }
  bool IsHost() const override { return false; }
  absl::StatusOr<kernels::BufferPtr> Allocate(int64_t bytes, const std::string& name) override {
    return std::make_unique<DeviceLikeBuffer>(this, bytes, name);
  }
};

TEST_CASE("a device pool reaches the transports through a host mirror, a host pool directly", "[block_pool]") {
  {
    BlockPool host(kLayout, 3);
    auto view = TransferRegion::For(&host);
    REQUIRE(view.ok());
    REQUIRE_FALSE((*view)->mirrored());
    REQUIRE((*view)->base() == host.region_base());
    REQUIRE((*view)->Stage({0, 2}).ok());
  }
  DeviceLikeType type;
  BlockPool pool(kLayout, 6, type);
  const int64_t bb = pool.block_bytes();
  for (int32_t b = 0; b < 6; ++b) {
    std::vector<uint8_t> bytes(bb, static_cast<uint8_t>(10 + b));
    REQUIRE(pool.WriteBlock(b, bytes.data()).ok());
  }
  auto view = TransferRegion::For(&pool);
  REQUIRE(view.ok());
  REQUIRE((*view)->mirrored());
  REQUIRE((*view)->base() != pool.region_base());
  REQUIRE((*view)->bytes() == static_cast<uint64_t>(pool.bytes()));
  const uint8_t* mirror = static_cast<const uint8_t*>((*view)->base());
  REQUIRE((*view)->Stage({4, 1, 2}).ok());  // A run (1, 2) and a single block.
  for (int32_t b = 0; b < 6; ++b) {
    const bool staged = b == 1 || b == 2 || b == 4;
    INFO("block " << b);
    REQUIRE(mirror[b * bb] == (staged ? 10 + b : 0));
    REQUIRE(mirror[b * bb + bb - 1] == (staged ? 10 + b : 0));
  }
  // A pull lands bytes in the mirror; Land moves only the blocks it names.
  uint8_t* landing = static_cast<uint8_t*>((*view)->base());
  std::fill(landing + 3 * bb, landing + 5 * bb, uint8_t{99});
  REQUIRE((*view)->Land({3}).ok());
  std::vector<uint8_t> got(bb);
  REQUIRE(pool.ReadBlock(3, got.data()).ok());
  REQUIRE(got == std::vector<uint8_t>(bb, 99));
  REQUIRE(pool.ReadBlock(4, got.data()).ok());
  REQUIRE(got == std::vector<uint8_t>(bb, 14));
  REQUIRE((*view)->Stage({5, 6}).code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::engine

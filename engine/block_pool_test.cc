#include "engine/block_pool.h"

#include <catch2/catch.hpp>
#include <memory>
#include <set>

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

}  // namespace
}  // namespace duet::engine

#include "kvtransfer/layout.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"

// Readable failures for CHECK(segments == ...).
template <>
struct Catch::StringMaker<duet::kvtransfer::Segment> {
  static std::string convert(const duet::kvtransfer::Segment& s) {
    return "{src " + std::to_string(s.src_offset) + ", dst " + std::to_string(s.dst_offset) +
           ", len " + std::to_string(s.length) + "}";
  }
};

namespace duet::kvtransfer {
namespace {

using LayerRange = std::pair<int64_t, int64_t>;

struct Model {
  int64_t layers = 12;
  int64_t heads = 8;
  int64_t block_size = 2;
  int64_t head_dim = 4;
  int64_t dtype_bytes = 4;
};

// [0, total) cut into `parts` near-equal pieces: {0, b1, ..., total}.
std::vector<int64_t> EvenBounds(int64_t total, int64_t parts) {
  std::vector<int64_t> bounds;
  for (int64_t p = 0; p <= parts; ++p) bounds.push_back(total * p / parts);
  return bounds;
}

// The shards of one instance, pipeline stage major, as an instance would
// number its workers.
std::vector<ShardLayout> Grid(const Model& m, const std::vector<int64_t>& layer_bounds,
                              const std::vector<int64_t>& head_bounds) {
  std::vector<ShardLayout> shards;
  for (size_t l = 0; l + 1 < layer_bounds.size(); ++l) {
    for (size_t h = 0; h + 1 < head_bounds.size(); ++h) {
      shards.push_back(ShardLayout{.num_layers_total = m.layers,
                                   .layer_begin = layer_bounds[l],
                                   .layer_end = layer_bounds[l + 1],
                                   .num_kv_heads_total = m.heads,
                                   .head_begin = head_bounds[h],
                                   .head_end = head_bounds[h + 1],
                                   .block_size = m.block_size,
                                   .head_dim = m.head_dim,
                                   .dtype_bytes = m.dtype_bytes});
    }
  }
  return shards;
}

std::vector<ShardLayout> Grid(const Model& m, const std::vector<int64_t>& layer_bounds, int tp) {
  return Grid(m, layer_bounds, EvenBounds(m.heads, tp));
}

// The test's own arithmetic for the pool layout, so that a wrong stride in
// the code under test cannot cancel out.
uint64_t ElementIndex(const ShardLayout& s, int64_t block, int64_t layer, int64_t kv,
                      int64_t head, int64_t slot, int64_t dim) {
  const int64_t local_layers = s.layer_end - s.layer_begin;
  const int64_t local_heads = s.head_end - s.head_begin;
  return static_cast<uint64_t>(
      ((((block * local_layers + (layer - s.layer_begin)) * 2 + kv) * local_heads +
        (head - s.head_begin)) *
           s.block_size +
       slot) *
          s.head_dim +
      dim);
}

uint64_t TestBlockElements(const ShardLayout& s) {
  return static_cast<uint64_t>((s.layer_end - s.layer_begin) * 2 * (s.head_end - s.head_begin) *
                               s.block_size * s.head_dim);
}

// Elements are unsigned integers of dtype_bytes bytes, little-endian
// regardless of host, which is enough to tag every element uniquely.
void Store(uint8_t* p, int64_t bytes, uint32_t v) {
  for (int64_t b = 0; b < bytes; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}
uint32_t Load(const uint8_t* p, int64_t bytes) {
  uint32_t v = 0;
  for (int64_t b = 0; b < bytes; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
  return v;
}

struct Tuple {
  int64_t block, layer, kv, head, slot, dim;
};

// 1 + the dense index of (logical block, global layer, K|V, global head,
// slot, dim); 0 is "never written" and all-ones marks source blocks that are
// not part of the transfer.
uint32_t Tag(const Model& m, const Tuple& t) {
  return static_cast<uint32_t>(
      1 + (((((t.block * m.layers + t.layer) * 2 + t.kv) * m.heads + t.head) * m.block_size +
             t.slot) *
               m.head_dim +
           t.dim));
}
uint32_t Poison(const Model& m) {
  return m.dtype_bytes >= 4 ? 0xFFFFFFFFu : (1u << (8 * m.dtype_bytes)) - 1;
}

std::string Describe(const Tuple& t) {
  return "(block " + std::to_string(t.block) + ", layer " + std::to_string(t.layer) + ", " +
         (t.kv ? "V" : "K") + ", head " + std::to_string(t.head) + ", slot " +
         std::to_string(t.slot) + ", dim " + std::to_string(t.dim) + ")";
}

// Visits every element of shard `s` in pool block `block` as a global tuple.
template <typename F>
void ForEachElement(const ShardLayout& s, int64_t logical_block, F&& f) {
  for (int64_t layer = s.layer_begin; layer < s.layer_end; ++layer)
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t head = s.head_begin; head < s.head_end; ++head)
        for (int64_t slot = 0; slot < s.block_size; ++slot)
          for (int64_t dim = 0; dim < s.head_dim; ++dim)
            f(Tuple{logical_block, layer, kv, head, slot, dim});
}

// n distinct random pool block ids in [0, pool_blocks), fixed seed.
std::vector<int32_t> RandomIds(int n, int pool_blocks, uint32_t seed) {
  std::vector<int32_t> all(pool_blocks);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

struct TaggedCase {
  Model model;
  std::vector<ShardLayout> src;
  std::vector<ShardLayout> dst;
  int num_blocks = 3;
  // Applied one after another into the same destination pools (a layer-wise
  // pull); empty means one transfer of all layers.
  std::vector<std::optional<LayerRange>> ranges = {std::nullopt};
  uint32_t seed = 1;
};

// Fills source pools with tags, plans and applies every range with memcpy into
// zeroed destination pools, then checks every destination byte.
void RunTagged(const TaggedCase& c) {
  const Model& m = c.model;
  const int n = c.num_blocks;
  const int pool_blocks = 2 * n + 3;
  REQUIRE(uint64_t{static_cast<uint64_t>(n)} * m.layers * 2 * m.heads * m.block_size * m.head_dim +
              1 <
          Poison(m));

  std::vector<std::vector<int32_t>> src_ids, dst_ids;
  std::vector<std::vector<uint8_t>> src_pools, dst_pools;
  for (size_t s = 0; s < c.src.size(); ++s) {
    src_ids.push_back(RandomIds(n, pool_blocks, c.seed * 1000 + s));
    const ShardLayout& sh = c.src[s];
    std::vector<uint8_t> pool(pool_blocks * TestBlockElements(sh) * m.dtype_bytes, 0xFF);
    for (int i = 0; i < n; ++i) {
      ForEachElement(sh, i, [&](const Tuple& t) {
        const uint64_t e = ElementIndex(sh, src_ids[s][i], t.layer, t.kv, t.head, t.slot, t.dim);
        Store(&pool[e * m.dtype_bytes], m.dtype_bytes, Tag(m, t));
      });
    }
    src_pools.push_back(std::move(pool));
  }
  for (size_t d = 0; d < c.dst.size(); ++d) {
    dst_ids.push_back(RandomIds(n, pool_blocks, c.seed * 1000 + 500 + d));
    dst_pools.emplace_back(pool_blocks * TestBlockElements(c.dst[d]) * m.dtype_bytes, 0);
  }

  auto in_ranges = [&](int64_t layer) {
    for (const auto& r : c.ranges) {
      if (!r || (layer >= r->first && layer < r->second)) return true;
    }
    return false;
  };

  uint64_t bytes_moved = 0;
  for (const auto& range : c.ranges) {
    auto plans = PlanTransfer(c.src, c.dst, src_ids, dst_ids, range);
    REQUIRE(plans.ok());
    std::vector<std::pair<int, int>> seen;
    for (const TransferPlan& p : *plans) {
      REQUIRE(p.src_shard >= 0);
      REQUIRE(p.src_shard < static_cast<int>(c.src.size()));
      REQUIRE(p.dst_shard >= 0);
      REQUIRE(p.dst_shard < static_cast<int>(c.dst.size()));
      REQUIRE(std::find(seen.begin(), seen.end(), std::make_pair(p.src_shard, p.dst_shard)) ==
              seen.end());
      seen.emplace_back(p.src_shard, p.dst_shard);
      REQUIRE_FALSE(p.segments.empty());
      const auto& src_pool = src_pools[p.src_shard];
      auto& dst_pool = dst_pools[p.dst_shard];
      for (const Segment& seg : p.segments) {
        REQUIRE(seg.length > 0);
        REQUIRE(seg.src_offset + seg.length <= src_pool.size());
        REQUIRE(seg.dst_offset + seg.length <= dst_pool.size());
        bytes_moved += seg.length;
      }
      ApplySegments(src_pool.data(), dst_pool.data(), p.segments);
    }
  }

  // Each destination byte is written exactly once: no duplicated work.
  uint64_t expected_bytes = 0;
  for (const ShardLayout& sh : c.dst) {
    for (int64_t layer = sh.layer_begin; layer < sh.layer_end; ++layer) {
      if (in_ranges(layer)) {
        expected_bytes += static_cast<uint64_t>(n) * 2 * (sh.head_end - sh.head_begin) *
                          sh.block_size * sh.head_dim * m.dtype_bytes;
      }
    }
  }
  CHECK(bytes_moved == expected_bytes);

  for (size_t d = 0; d < c.dst.size(); ++d) {
    const ShardLayout& sh = c.dst[d];
    const auto& pool = dst_pools[d];
    uint64_t mismatches = 0;
    std::string first;
    auto expect = [&](uint64_t element, uint32_t want, const std::string& where) {
      const uint32_t got = Load(&pool[element * m.dtype_bytes], m.dtype_bytes);
      if (got != want) {
        if (mismatches++ == 0) {
          first = "destination shard " + std::to_string(d) + " " + where + ": got tag " +
                  std::to_string(got) + ", want " + std::to_string(want);
        }
      }
    };
    std::vector<bool> transferred(pool_blocks, false);
    for (int i = 0; i < n; ++i) {
      transferred[dst_ids[d][i]] = true;
      ForEachElement(sh, i, [&](const Tuple& t) {
        const uint64_t e = ElementIndex(sh, dst_ids[d][i], t.layer, t.kv, t.head, t.slot, t.dim);
        expect(e, in_ranges(t.layer) ? Tag(m, t) : 0, Describe(t));
      });
    }
    for (int b = 0; b < pool_blocks; ++b) {
      if (transferred[b]) continue;
      for (uint64_t e = 0; e < TestBlockElements(sh); ++e) {
        expect(b * TestBlockElements(sh) + e, 0, "untouched pool block " + std::to_string(b));
      }
    }
    INFO(first);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("every tensor-parallel pair up to 8 moves tagged KV", "[kvtransfer][layout]") {
  const int src_tp = GENERATE(1, 2, 4, 8);
  const int dst_tp = GENERATE(1, 2, 4, 8);
  const int64_t dtype_bytes = GENERATE(4, 2);
  INFO("src TP " << src_tp << " -> dst TP " << dst_tp << ", " << dtype_bytes << "-byte elements");
  Model m{.layers = 3, .heads = 8, .block_size = 2, .head_dim = 4, .dtype_bytes = dtype_bytes};
  RunTagged(TaggedCase{.model = m,
                       .src = Grid(m, {0, 3}, src_tp),
                       .dst = Grid(m, {0, 3}, dst_tp),
                       .num_blocks = 3,
                       .seed = static_cast<uint32_t>(src_tp * 10 + dst_tp)});
}

TEST_CASE("non-power-of-two and uneven head splits move tagged KV", "[kvtransfer][layout]") {
  using Bounds = std::vector<int64_t>;
  // 6 kv heads: TP 1, 2, 3, 6 and two uneven splits.
  const Bounds src_heads = GENERATE(Bounds{0, 6}, Bounds{0, 3, 6}, Bounds{0, 2, 4, 6},
                                    Bounds{0, 1, 2, 3, 4, 5, 6}, Bounds{0, 1, 6});
  const Bounds dst_heads = GENERATE(Bounds{0, 6}, Bounds{0, 3, 6}, Bounds{0, 2, 4, 6},
                                    Bounds{0, 1, 2, 3, 4, 5, 6}, Bounds{0, 4, 6});
  const int64_t dtype_bytes = GENERATE(4, 2);
  INFO("src shards " << src_heads.size() - 1 << ", dst shards " << dst_heads.size() - 1
                     << ", dtype bytes " << dtype_bytes);
  Model m{.layers = 2, .heads = 6, .block_size = 3, .head_dim = 4, .dtype_bytes = dtype_bytes};
  RunTagged(TaggedCase{.model = m,
                       .src = Grid(m, {0, 2}, src_heads),
                       .dst = Grid(m, {0, 2}, dst_heads),
                       .num_blocks = 4,
                       .seed = static_cast<uint32_t>(src_heads.size() * 10 + dst_heads.size())});
}

TEST_CASE("pipeline splits with tensor parallelism move tagged KV", "[kvtransfer][layout]") {
  using Bounds = std::vector<int64_t>;
  // 12 layers: PP 1, 2, 3 and an uneven [0,5) + [5,12) on the source; PP 1,
  // 2, 4 and an uneven [0,7) + [7,12) on the destination.
  const Bounds src_layers =
      GENERATE(Bounds{0, 12}, Bounds{0, 6, 12}, Bounds{0, 4, 8, 12}, Bounds{0, 5, 12});
  const Bounds dst_layers =
      GENERATE(Bounds{0, 12}, Bounds{0, 6, 12}, Bounds{0, 3, 6, 9, 12}, Bounds{0, 7, 12});
  const int src_tp = GENERATE(1, 2);
  const int dst_tp = GENERATE(1, 4);
  const int64_t dtype_bytes = GENERATE(4, 2);
  INFO("src PP " << src_layers.size() - 1 << " TP " << src_tp << " -> dst PP "
                 << dst_layers.size() - 1 << " TP " << dst_tp << ", dtype bytes " << dtype_bytes);
  Model m{.layers = 12, .heads = 4, .block_size = 2, .head_dim = 4, .dtype_bytes = dtype_bytes};
  RunTagged(TaggedCase{.model = m,
                       .src = Grid(m, src_layers, src_tp),
                       .dst = Grid(m, dst_layers, dst_tp),
                       .num_blocks = 3,
                       .seed = static_cast<uint32_t>(src_layers.size() * 100 +
                                                     dst_layers.size() * 10 + src_tp + dst_tp)});
}

TEST_CASE("layer ranges move only their layers", "[kvtransfer][layout]") {
  const int64_t dtype_bytes = GENERATE(4, 2);
  Model m{.layers = 12, .heads = 4, .block_size = 3, .head_dim = 4, .dtype_bytes = dtype_bytes};
  TaggedCase c{.model = m,
               .src = Grid(m, {0, 5, 12}, 2),
               .dst = Grid(m, {0, 3, 6, 9, 12}, 1),
               .num_blocks = 3};
  SECTION("single ranges") {
    const LayerRange r = GENERATE(LayerRange{0, 12}, LayerRange{0, 1}, LayerRange{3, 7},
                                  LayerRange{4, 5}, LayerRange{5, 6}, LayerRange{11, 12});
    INFO("layers [" << r.first << ", " << r.second << ")");
    c.ranges = {r};
    RunTagged(c);
  }
  SECTION("disjoint ranges skip the layers between them") {
    c.ranges = {LayerRange{1, 3}, LayerRange{8, 10}};
    RunTagged(c);
  }
  SECTION("one layer at a time adds up to the whole transfer") {
    c.ranges.clear();
    for (int64_t l = 0; l < m.layers; ++l) c.ranges.push_back(LayerRange{l, l + 1});
    RunTagged(c);
  }
  SECTION("an empty range plans nothing") {
    std::vector<std::vector<int32_t>> src_ids(c.src.size(), {0, 1}), dst_ids(c.dst.size(), {0, 1});
    auto plans = PlanTransfer(c.src, c.dst, src_ids, dst_ids, LayerRange{6, 6});
    REQUIRE(plans.ok());
    CHECK(plans->empty());
  }
}

// ---- Segment minimality ------------------------------------------------

Model SmallModel() {
  return Model{.layers = 3, .heads = 8, .block_size = 2, .head_dim = 4, .dtype_bytes = 4};
}

TEST_CASE("ShardBlockBytes is layers x K|V x heads x slots x dim x dtype", "[kvtransfer][layout]") {
  Model m = SmallModel();
  CHECK(ShardBlockBytes(Grid(m, {0, 3}, 1)[0]) == 3 * 2 * 8 * 2 * 4 * 4);
  CHECK(ShardBlockBytes(Grid(m, {0, 1, 3}, 4)[4]) == 2 * 2 * 2 * 2 * 4 * 4);
  m.dtype_bytes = 2;
  CHECK(ShardBlockBytes(Grid(m, {0, 3}, 2)[1]) == 3 * 2 * 4 * 2 * 4 * 2);
}

TEST_CASE("1 to 1 with consecutive ids is one segment", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  const auto shards = Grid(m, {0, 3}, 1);
  const uint64_t bb = ShardBlockBytes(shards[0]);
  SECTION("ascending") {
    auto plans = PlanTransfer(shards, shards, {{3, 4, 5, 6}}, {{10, 11, 12, 13}});
    REQUIRE(plans.ok());
    REQUIRE(plans->size() == 1);
    CHECK((*plans)[0].src_shard == 0);
    CHECK((*plans)[0].dst_shard == 0);
    REQUIRE((*plans)[0].segments.size() == 1);
    CHECK((*plans)[0].segments[0] == Segment{3 * bb, 10 * bb, 4 * bb});
  }
  SECTION("descending on both sides still merges") {
    auto plans = PlanTransfer(shards, shards, {{6, 5, 4, 3}}, {{13, 12, 11, 10}});
    REQUIRE(plans.ok());
    REQUIRE(plans->size() == 1);
    REQUIRE((*plans)[0].segments.size() == 1);
    CHECK((*plans)[0].segments[0] == Segment{3 * bb, 10 * bb, 4 * bb});
  }
  SECTION("a full layer range is the same single segment") {
    auto plans = PlanTransfer(shards, shards, {{3, 4}}, {{0, 1}}, LayerRange{0, 3});
    REQUIRE(plans.ok());
    REQUIRE((*plans)[0].segments.size() == 1);
    CHECK((*plans)[0].segments[0] == Segment{3 * bb, 0, 2 * bb});
  }
}

TEST_CASE("1 to 1 with scattered ids is one segment per block", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  const auto shards = Grid(m, {0, 3}, 1);
  const uint64_t bb = ShardBlockBytes(shards[0]);
  // Consecutive on the source only, then on the destination only: neither merges.
  auto plans = PlanTransfer(shards, shards, {{0, 1, 2}}, {{5, 3, 7}});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 1);
  CHECK((*plans)[0].segments ==
        std::vector<Segment>{{0, 5 * bb, bb}, {bb, 3 * bb, bb}, {2 * bb, 7 * bb, bb}});
  plans = PlanTransfer(shards, shards, {{4, 0, 8}}, {{1, 2, 3}});
  REQUIRE(plans.ok());
  CHECK((*plans)[0].segments.size() == 3);
}

TEST_CASE("same head range on both sides moves whole blocks", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  const auto shards = Grid(m, {0, 3}, 2);
  const uint64_t bb = ShardBlockBytes(shards[0]);
  auto plans = PlanTransfer(shards, shards, {{2, 3, 9}, {0, 4, 1}}, {{7, 8, 9}, {1, 5, 3}});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 2);  // shard 0 -> 0 and 1 -> 1 only
  CHECK((*plans)[0].src_shard == 0);
  CHECK((*plans)[0].dst_shard == 0);
  CHECK((*plans)[0].segments == std::vector<Segment>{{2 * bb, 7 * bb, 2 * bb}, {9 * bb, 9 * bb, bb}});
  CHECK((*plans)[1].src_shard == 1);
  CHECK((*plans)[1].dst_shard == 1);
  CHECK((*plans)[1].segments ==
        std::vector<Segment>{{0, 1 * bb, bb}, {1 * bb, 3 * bb, bb}, {4 * bb, 5 * bb, bb}});
}

TEST_CASE("TP 2 to TP 1 is one segment per block, layer and K|V", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  const auto src = Grid(m, {0, 3}, 2);
  const auto dst = Grid(m, {0, 3}, 1);
  const uint64_t head_bytes = m.block_size * m.head_dim * m.dtype_bytes;
  auto plans = PlanTransfer(src, dst, {{0, 1}, {0, 1}}, {{0, 1}});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 2);
  for (const TransferPlan& p : *plans) {
    INFO("source shard " << p.src_shard);
    CHECK(p.dst_shard == 0);
    // Half the heads of each (block, layer, K|V): source-contiguous across
    // layers and blocks, but the destination interleaves the other half.
    REQUIRE(p.segments.size() == 2 * 3 * 2);
    for (const Segment& s : p.segments) CHECK(s.length == 4 * head_bytes);
    CHECK(p.segments[0].src_offset == 0);
    CHECK(p.segments[0].dst_offset == p.src_shard * 4 * head_bytes);
    CHECK(p.segments[1].src_offset == 4 * head_bytes);
    CHECK(p.segments[1].dst_offset == 8 * head_bytes + p.src_shard * 4 * head_bytes);
  }
}

TEST_CASE("a head sub-range of one layer's K is one segment", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  const auto src = Grid(m, {0, 3}, 1);
  const auto dst = Grid(m, {0, 3}, 2);
  const uint64_t head_bytes = m.block_size * m.head_dim * m.dtype_bytes;
  const uint64_t src_bb = ShardBlockBytes(src[0]);
  const uint64_t dst_bb = ShardBlockBytes(dst[0]);
  auto plans = PlanTransfer(src, dst, {{5}}, {{2}, {6}}, LayerRange{1, 2});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 2);
  const uint64_t src_layer = 5 * src_bb + 1 * 2 * 8 * head_bytes;
  // dst 0 takes heads [0,4) of K then V; dst 1 heads [4,8).
  CHECK((*plans)[0].dst_shard == 0);
  CHECK((*plans)[0].segments ==
        std::vector<Segment>{{src_layer, 2 * dst_bb + 2 * 4 * head_bytes, 4 * head_bytes},
                             {src_layer + 8 * head_bytes, 2 * dst_bb + 3 * 4 * head_bytes,
                              4 * head_bytes}});
  CHECK((*plans)[1].dst_shard == 1);
  CHECK((*plans)[1].segments ==
        std::vector<Segment>{{src_layer + 4 * head_bytes, 6 * dst_bb + 2 * 4 * head_bytes,
                              4 * head_bytes},
                             {src_layer + 12 * head_bytes, 6 * dst_bb + 3 * 4 * head_bytes,
                              4 * head_bytes}});
}

TEST_CASE("pipeline stages move one layer slice per block", "[kvtransfer][layout]") {
  const Model m{.layers = 12, .heads = 4, .block_size = 2, .head_dim = 4, .dtype_bytes = 2};
  const auto whole = Grid(m, {0, 12}, 1);
  const auto stages = Grid(m, {0, 5, 12}, 1);
  const uint64_t layer_bytes = 2 * 4 * 2 * 4 * 2;
  // PP 1 -> PP 2 with consecutive ids on both sides: each stage's slice is
  // contiguous in the source block, but the next block's slice is not next to it.
  auto plans = PlanTransfer(whole, stages, {{0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 2);
  CHECK((*plans)[0].segments.size() == 3);
  CHECK((*plans)[0].segments[0] == Segment{0, 0, 5 * layer_bytes});
  CHECK((*plans)[1].segments.size() == 3);
  CHECK((*plans)[1].segments[1] == Segment{12 * layer_bytes + 5 * layer_bytes, 7 * layer_bytes,
                                           7 * layer_bytes});
  // PP 2 -> PP 2 with the same split is whole blocks again.
  plans = PlanTransfer(stages, stages, {{0, 1, 2}, {4, 5, 6}}, {{3, 4, 5}, {0, 1, 2}});
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 2);
  CHECK((*plans)[0].segments == std::vector<Segment>{{0, 3 * 5 * layer_bytes, 3 * 5 * layer_bytes}});
  CHECK((*plans)[1].segments ==
        std::vector<Segment>{{4 * 7 * layer_bytes, 0, 3 * 7 * layer_bytes}});
}

TEST_CASE("no blocks plans nothing", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  auto plans = PlanTransfer(Grid(m, {0, 3}, 2), Grid(m, {0, 3}, 1), {{}, {}}, {{}});
  REQUIRE(plans.ok());
  CHECK(plans->empty());
}

// ---- Validation ----------------------------------------------------------

void ExpectInvalid(const absl::StatusOr<std::vector<TransferPlan>>& result,
                   const std::string& substring) {
  INFO(result.status().ToString());
  REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(result.status().message()).find(substring) != std::string::npos);
}

TEST_CASE("PlanTransfer rejects incompatible or malformed inputs", "[kvtransfer][layout]") {
  const Model m = SmallModel();
  auto src = Grid(m, {0, 3}, 2);
  auto dst = Grid(m, {0, 3}, 1);
  std::vector<std::vector<int32_t>> src_ids = {{0, 1}, {2, 3}};
  std::vector<std::vector<int32_t>> dst_ids = {{4, 5}};
  REQUIRE(PlanTransfer(src, dst, src_ids, dst_ids).ok());

  SECTION("dtype mismatch") {
    for (auto& s : dst) s.dtype_bytes = 2;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "dtype");
  }
  SECTION("block size mismatch") {
    for (auto& s : dst) s.block_size = 4;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "block size");
  }
  SECTION("head dim mismatch") {
    src[1].head_dim = 8;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "head dim");
  }
  SECTION("model totals mismatch") {
    dst[0].num_layers_total = 4;
    dst[0].layer_end = 4;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "total layer count");
    dst = Grid(m, {0, 3}, 1);
    dst[0].num_kv_heads_total = 16;
    dst[0].head_end = 16;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "total kv head count");
  }
  SECTION("gap between source shards") {
    src[1].head_begin = 5;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "gap");
  }
  SECTION("overlapping destination shards") {
    dst = Grid(m, {0, 2, 3}, 1);
    dst[1].layer_begin = 1;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, {{4, 5}, {6, 7}}), "overlap");
  }
  SECTION("missing pipeline stage") {
    dst = Grid(m, {0, 2, 3}, 1);
    dst.pop_back();
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "gap");
  }
  SECTION("shard out of the model's bounds") {
    dst[0].layer_end = 4;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "layer range");
    dst = Grid(m, {0, 3}, 1);
    dst[0].head_begin = 8;
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids), "kv head range");
  }
  SECTION("no shards") {
    ExpectInvalid(PlanTransfer({}, dst, {}, dst_ids), "no source shards");
    ExpectInvalid(PlanTransfer(src, {}, src_ids, {}), "no destination shards");
  }
  SECTION("id lists do not match the shards") {
    ExpectInvalid(PlanTransfer(src, dst, {{0, 1}}, dst_ids), "lists for 2 shards");
  }
  SECTION("id lists of different lengths") {
    ExpectInvalid(PlanTransfer(src, dst, {{0, 1}, {2}}, dst_ids), "expected 2");
    ExpectInvalid(PlanTransfer(src, dst, src_ids, {{4, 5, 6}}), "expected 2");
  }
  SECTION("negative ids") {
    ExpectInvalid(PlanTransfer(src, dst, {{0, -1}, {2, 3}}, dst_ids), "negative");
    ExpectInvalid(PlanTransfer(src, dst, src_ids, {{-4, 5}}), "negative");
  }
  SECTION("a destination block written twice") {
    ExpectInvalid(PlanTransfer(src, dst, src_ids, {{5, 5}}), "twice");
    // Reading one source block twice is allowed.
    CHECK(PlanTransfer(src, dst, {{1, 1}, {2, 3}}, dst_ids).ok());
  }
  SECTION("layer range outside the model") {
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids, LayerRange{2, 4}), "layer range");
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids, LayerRange{-1, 2}), "layer range");
    ExpectInvalid(PlanTransfer(src, dst, src_ids, dst_ids, LayerRange{2, 1}), "layer range");
  }
}

}  // namespace
}  // namespace duet::kvtransfer

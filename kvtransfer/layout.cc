#include "kvtransfer/layout.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::kvtransfer {
namespace {

std::string ShardName(const char* side, size_t index) { return absl::StrCat(side, " shard ", index); }

absl::Status ValidateShard(const ShardLayout& s, const std::string& name) {
  if (s.block_size <= 0 || s.head_dim <= 0 || s.dtype_bytes <= 0 || s.num_layers_total <= 0 ||
      s.num_kv_heads_total <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": block_size, head_dim, dtype_bytes and model totals must be positive"));
  }
  if (s.layer_begin < 0 || s.layer_begin >= s.layer_end || s.layer_end > s.num_layers_total) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": layer range [", s.layer_begin, ", ",
                                                   s.layer_end, ") is empty or outside [0, ",
                                                   s.num_layers_total, ")"));
  }
  if (s.head_begin < 0 || s.head_begin >= s.head_end || s.head_end > s.num_kv_heads_total) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": kv head range [", s.head_begin, ", ",
                                                   s.head_end, ") is empty or outside [0, ",
                                                   s.num_kv_heads_total, ")"));
  }
  return absl::OkStatus();
}

// Prefill and decode must agree on everything that fixes a block's shape;
// each mismatch names itself so an operator can tell a dtype problem from a
// block-size one.
absl::Status CheckCompatible(const ShardLayout& ref, const std::string& ref_name,
                             const ShardLayout& s, const std::string& name) {
  auto mismatch = [&](const char* what, int64_t a, int64_t b) {
    return absl::InvalidArgumentError(absl::StrCat(what, " mismatch: ", ref_name, " has ", a,
                                                   " but ", name, " has ", b));
  };
  if (s.dtype_bytes != ref.dtype_bytes) {
    return mismatch("dtype (bytes per element)", ref.dtype_bytes, s.dtype_bytes);
  }
  if (s.block_size != ref.block_size) return mismatch("block size", ref.block_size, s.block_size);
  if (s.head_dim != ref.head_dim) return mismatch("head dim", ref.head_dim, s.head_dim);
  if (s.num_layers_total != ref.num_layers_total) {
    return mismatch("total layer count", ref.num_layers_total, s.num_layers_total);
  }
  if (s.num_kv_heads_total != ref.num_kv_heads_total) {
    return mismatch("total kv head count", ref.num_kv_heads_total, s.num_kv_heads_total);
  }
  return absl::OkStatus();
}

// The shards of one instance must cover every (layer, head) cell exactly
// once: a gap would leave decode KV uninitialised, an overlap makes the source
// of a byte ambiguous. All shards are in bounds (checked before), so pairwise
// disjoint plus total area equal to the model's means an exact tiling.
absl::Status CheckTiling(const std::vector<ShardLayout>& shards, const char* side) {
  for (size_t a = 0; a < shards.size(); ++a) {
    for (size_t b = a + 1; b < shards.size(); ++b) {
      const ShardLayout& x = shards[a];
      const ShardLayout& y = shards[b];
      int64_t l0 = std::max(x.layer_begin, y.layer_begin), l1 = std::min(x.layer_end, y.layer_end);
      int64_t h0 = std::max(x.head_begin, y.head_begin), h1 = std::min(x.head_end, y.head_end);
      if (l0 < l1 && h0 < h1) {
        return absl::InvalidArgumentError(absl::StrCat(
            ShardName(side, a), " and ", ShardName(side, b), " overlap at layers [", l0, ", ", l1,
            ") x kv heads [", h0, ", ", h1, ")"));
      }
    }
  }
  int64_t covered = 0;
  for (const ShardLayout& s : shards) covered += s.num_layers() * s.num_heads();
  const int64_t total = shards[0].num_layers_total * shards[0].num_kv_heads_total;
  if (covered != total) {
    return absl::InvalidArgumentError(absl::StrCat(side, " shards leave a gap: they cover ",
                                                   covered, " of ", total,
                                                   " (layer, kv head) cells"));
  }
  return absl::OkStatus();
}

absl::Status CheckBlockIds(const std::vector<std::vector<int32_t>>& ids, size_t num_shards,
                           const char* side, size_t num_blocks, bool unique) {
  if (ids.size() != num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(side, " block id lists: got ", ids.size(),
                                                   " lists for ", num_shards, " shards"));
  }
  for (size_t s = 0; s < ids.size(); ++s) {
    if (ids[s].size() != num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          ShardName(side, s), " lists ", ids[s].size(), " block ids, expected ", num_blocks,
          " (every shard names every logical block)"));
    }
    absl::flat_hash_set<int32_t> seen;
    for (size_t i = 0; i < ids[s].size(); ++i) {
      const int32_t id = ids[s][i];
      if (id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(ShardName(side, s), ": negative block id ", id, " at index ", i));
      }
      if (unique && !seen.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            ShardName(side, s), ": block id ", id, " appears twice (two writes to one block)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const std::vector<ShardLayout>& src_shards,
                      const std::vector<ShardLayout>& dst_shards,
                      const std::vector<std::vector<int32_t>>& src_block_ids,
                      const std::vector<std::vector<int32_t>>& dst_block_ids,
                      const std::optional<std::pair<int64_t, int64_t>>& layer_range) {
  if (src_shards.empty()) return absl::InvalidArgumentError("no source shards");
  if (dst_shards.empty()) return absl::InvalidArgumentError("no destination shards");
  for (size_t i = 0; i < src_shards.size(); ++i) {
    RETURN_IF_ERROR(ValidateShard(src_shards[i], ShardName("source", i)));
  }
  for (size_t i = 0; i < dst_shards.size(); ++i) {
    RETURN_IF_ERROR(ValidateShard(dst_shards[i], ShardName("destination", i)));
  }
  const std::string ref_name = ShardName("source", 0);
  for (size_t i = 1; i < src_shards.size(); ++i) {
    RETURN_IF_ERROR(
        CheckCompatible(src_shards[0], ref_name, src_shards[i], ShardName("source", i)));
  }
  for (size_t i = 0; i < dst_shards.size(); ++i) {
    RETURN_IF_ERROR(
        CheckCompatible(src_shards[0], ref_name, dst_shards[i], ShardName("destination", i)));
  }
  RETURN_IF_ERROR(CheckTiling(src_shards, "source"));
  RETURN_IF_ERROR(CheckTiling(dst_shards, "destination"));
  const size_t num_blocks = src_block_ids.empty() ? 0 : src_block_ids[0].size();
  // Several destinations reading one source block is harmless; one
  // destination block written twice is not.
  RETURN_IF_ERROR(
      CheckBlockIds(src_block_ids, src_shards.size(), "source", num_blocks, /*unique=*/false));
  RETURN_IF_ERROR(CheckBlockIds(dst_block_ids, dst_shards.size(), "destination", num_blocks,
                                /*unique=*/true));
  if (layer_range.has_value()) {
    const auto [a, b] = *layer_range;
    if (a < 0 || a > b || b > src_shards[0].num_layers_total) {
      return absl::InvalidArgumentError(absl::StrCat("layer range [", a, ", ", b,
                                                     ") is not within [0, ",
                                                     src_shards[0].num_layers_total, "]"));
    }
  }
  return absl::OkStatus();
}

// Merges pieces that continue an earlier piece on both sides. Sorting by
// source offset puts a piece after every piece it could extend; the map finds
// the run it extends even when duplicate source ids interleave other runs.
std::vector<Segment> MergePieces(std::vector<Segment> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const Segment& x, const Segment& y) {
    return std::tie(x.src_offset, x.dst_offset) < std::tie(y.src_offset, y.dst_offset);
  });
  std::vector<Segment> out;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, size_t> open_runs;  // (src end, dst end)
  for (const Segment& p : pieces) {
    auto it = open_runs.find({p.src_offset, p.dst_offset});
    size_t index;
    if (it != open_runs.end()) {
      index = it->second;
      open_runs.erase(it);
      out[index].length += p.length;
    } else {
      index = out.size();
      out.push_back(p);
    }
    const Segment& run = out[index];
    open_runs[{run.src_offset + run.length, run.dst_offset + run.length}] = index;
  }
  return out;
}

}  // namespace

uint64_t ShardBlockBytes(const ShardLayout& shard) { return shard.BlockBytes(); }

absl::StatusOr<std::vector<TransferPlan>> PlanTransfer(
    const std::vector<ShardLayout>& src_shards, const std::vector<ShardLayout>& dst_shards,
    const std::vector<std::vector<int32_t>>& src_block_ids,
    const std::vector<std::vector<int32_t>>& dst_block_ids,
    std::optional<std::pair<int64_t, int64_t>> layer_range) {
  RETURN_IF_ERROR(Validate(src_shards, dst_shards, src_block_ids, dst_block_ids, layer_range));
  const int64_t range_begin = layer_range ? layer_range->first : 0;
  const int64_t range_end = layer_range ? layer_range->second : src_shards[0].num_layers_total;
  const size_t num_blocks = src_block_ids[0].size();

  std::vector<TransferPlan> plans;
  for (size_t d = 0; d < dst_shards.size(); ++d) {
    const ShardLayout& dst = dst_shards[d];
    for (size_t s = 0; s < src_shards.size(); ++s) {
      const ShardLayout& src = src_shards[s];
      const int64_t l0 = std::max({src.layer_begin, dst.layer_begin, range_begin});
      const int64_t l1 = std::min({src.layer_end, dst.layer_end, range_end});
      const int64_t h0 = std::max(src.head_begin, dst.head_begin);
      const int64_t h1 = std::min(src.head_end, dst.head_end);
      if (l0 >= l1 || h0 >= h1 || num_blocks == 0) continue;

      // One piece per (block, layer, K|V): the shared head range is
      // contiguous on both sides because heads sit inside K|V.
      const uint64_t length = static_cast<uint64_t>(h1 - h0) * src.HeadBytes();
      std::vector<Segment> pieces;
      pieces.reserve(num_blocks * static_cast<size_t>(l1 - l0) * 2);
      for (size_t i = 0; i < num_blocks; ++i) {
        const uint64_t src_block = static_cast<uint64_t>(src_block_ids[s][i]) * src.BlockBytes();
        const uint64_t dst_block = static_cast<uint64_t>(dst_block_ids[d][i]) * dst.BlockBytes();
        for (int64_t layer = l0; layer < l1; ++layer) {
          for (uint64_t kv = 0; kv < 2; ++kv) {
            pieces.push_back(Segment{
                .src_offset = src_block + (layer - src.layer_begin) * src.LayerBytes() +
                              kv * src.KvBytes() + (h0 - src.head_begin) * src.HeadBytes(),
                .dst_offset = dst_block + (layer - dst.layer_begin) * dst.LayerBytes() +
                              kv * dst.KvBytes() + (h0 - dst.head_begin) * dst.HeadBytes(),
                .length = length,
            });
          }
        }
      }
      plans.push_back(TransferPlan{.src_shard = static_cast<int>(s),
                                   .dst_shard = static_cast<int>(d),
                                   .segments = MergePieces(std::move(pieces))});
    }
  }
  return plans;
}

void ApplySegments(const uint8_t* src, uint8_t* dst, const std::vector<Segment>& segments) {
  for (const Segment& seg : segments) {
    std::memcpy(dst + seg.dst_offset, src + seg.src_offset, seg.length);
  }
}

}  // namespace duet::kvtransfer

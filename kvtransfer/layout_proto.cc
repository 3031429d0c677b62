#include "kvtransfer/layout_proto.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::kvtransfer {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status Mismatch(const char* field, const std::string& theirs, const std::string& ours) {
  return absl::InvalidArgumentError(absl::StrCat("KV handle layout mismatch: ", field, " is ", theirs,
                                                 ", this decode worker has ", ours));
}

// An unset range (proto3 zero) means the whole model.
std::pair<int64_t, int64_t> Range(int64_t begin, int64_t end, int64_t total) {
  if (begin == 0 && end == 0) return {0, total};
  return {begin, end};
}

}  // namespace

proto::KvLayout WholeModelLayout(const kernels::KvLayout& pool) {
  proto::KvLayout l;
  l.set_num_layers(pool.num_layers);
  l.set_num_kv_heads(pool.num_kv_heads);
  l.set_block_size(pool.block_size);
  l.set_head_dim(pool.head_dim);
  l.set_dtype(kernels::DTypeName(pool.dtype));
  l.set_layer_begin(0);
  l.set_layer_end(pool.num_layers);
  l.set_head_begin(0);
  l.set_head_end(pool.num_kv_heads);
  return l;
}

ShardLayout ShardFromProto(const proto::KvLayout& l) {
  auto [lb, le] = Range(l.layer_begin(), l.layer_end(), l.num_layers());
  auto [hb, he] = Range(l.head_begin(), l.head_end(), l.num_kv_heads());
  return {.num_layers_total = l.num_layers(),
          .layer_begin = lb,
          .layer_end = le,
          .num_kv_heads_total = l.num_kv_heads(),
          .head_begin = hb,
          .head_end = he,
          .block_size = l.block_size(),
          .head_dim = l.head_dim(),
          .dtype_bytes = l.dtype() == "f32" ? 4 : 2};
}

absl::Status CheckHandle(const proto::KvHandle& h, const proto::KvLayout& own) {
  const proto::KvLayout& l = h.layout();
  if (l.dtype() != own.dtype()) return Mismatch("dtype", "\"" + l.dtype() + "\"", "\"" + own.dtype() + "\"");
  if (l.block_size() != own.block_size()) {
    return Mismatch("block_size", absl::StrCat(l.block_size()), absl::StrCat(own.block_size()));
  }
  if (l.num_layers() != own.num_layers()) {
    return Mismatch("num_layers", absl::StrCat(l.num_layers()), absl::StrCat(own.num_layers()));
  }
  if (l.num_kv_heads() != own.num_kv_heads()) {
    return Mismatch("num_kv_heads", absl::StrCat(l.num_kv_heads()), absl::StrCat(own.num_kv_heads()));
  }
  if (l.head_dim() != own.head_dim()) {
    return Mismatch("head_dim", absl::StrCat(l.head_dim()), absl::StrCat(own.head_dim()));
  }
  // One handle is one source shard; this worker pulls every layer and head
  // from it, so it must hold them all (the CPU backend has no TP/PP shards).
  const ShardLayout s = ShardFromProto(l);
  if (s.layer_begin != 0 || s.layer_end != l.num_layers()) {
    return Mismatch("layer range", absl::StrCat("[", s.layer_begin, ", ", s.layer_end, ")"),
                    absl::StrCat("[0, ", l.num_layers(), ")"));
  }
  if (s.head_begin != 0 || s.head_end != l.num_kv_heads()) {
    return Mismatch("head range", absl::StrCat("[", s.head_begin, ", ", s.head_end, ")"),
                    absl::StrCat("[0, ", l.num_kv_heads(), ")"));
  }
  if (h.num_tokens() <= 0) return absl::InvalidArgumentError("KV handle: num_tokens must be > 0");
  const int64_t blocks = CeilDiv(h.num_tokens(), l.block_size());
  if (h.block_ids_size() < blocks) {
    return absl::InvalidArgumentError(absl::StrCat("KV handle: ", h.block_ids_size(), " block ids for ",
                                                   h.num_tokens(), " tokens (", blocks, " needed)"));
  }
  if (h.block_epochs_size() != 0 && h.block_epochs_size() != h.block_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV handle: ", h.block_epochs_size(), " epochs for ",
                                                   h.block_ids_size(), " blocks"));
  }
  return absl::OkStatus();
}

}  // namespace duet::kvtransfer

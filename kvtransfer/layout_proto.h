// The control plane's KvLayout (proto/control.proto) in one place, beside
// PlanTransfer: built for a worker's pool, converted to the planner's
// ShardLayout, and checked when a decode worker accepts a handle.
//
//   proto::KvLayout own = WholeModelLayout(pool.layout());
//   RETURN_IF_ERROR(CheckHandle(offer.handle(), own));           // on receipt
//   PlanTransfer({ShardFromProto(handle.layout())}, {ShardFromProto(own)}, ...);
//
// Pure functions: thread-safe.
#ifndef DUET_KVTRANSFER_LAYOUT_PROTO_H_
#define DUET_KVTRANSFER_LAYOUT_PROTO_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/kv_layout.h"
#include "kvtransfer/layout.h"
#include "proto/control.pb.h"

namespace duet::kvtransfer {

// A pool shard holding every layer and kv head of the model (the CPU
// backend's only shape: it has no TP/PP shards), of the pool's KV dtype.
proto::KvLayout WholeModelLayout(const kernels::KvLayout& pool);

// The planner's description of a shard (an unset range means all).
ShardLayout ShardFromProto(const proto::KvLayout& layout);

// InvalidArgument naming the first field in which a handle's layout differs
// from this worker's (dtype, block_size, num_layers, num_kv_heads, head_dim,
// layer or head range), or in which the handle is malformed (block ids too
// few for num_tokens, epochs not one per block).
absl::Status CheckHandle(const proto::KvHandle& handle, const proto::KvLayout& own);

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_LAYOUT_PROTO_H_

// The engine core every worker role (prefill, decode, colocated) runs on:
// one set of engine options, which each role's service options embed, and
// the one loader that turns them into a backend, a model and a KV pool.
//
//   worker::EngineOptions e{.model_dir = dir, .threads = 2, .kv_blocks = 64};
//   ASSIGN_OR_RETURN(worker::EngineResources r, worker::LoadEngine(e));
//   r.model->Forward(batch, *r.pool);
//
// The flags that fill these (`--threads`, `--weight-dtype`, `--kv-blocks`,
// `--kv-memory`, `--block-size`, `--max-batch-tokens`, the prefix cache's)
// are the same for every role (tools/cmd_serve.cc). Plain values and a
// loader: thread-compatible.
#ifndef DUET_WORKER_ENGINE_CORE_H_
#define DUET_WORKER_ENGINE_CORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/serving_defaults.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/factory.h"
#include "worker/prefix_cache.h"

namespace duet::worker {

struct LoadedModel;

struct EngineOptions {
  std::string model_dir;
  std::string served_model_name;  // What Register reports; the directory's name when empty.
  int threads = 0;                // CPU backend threads; <= 0: every core.
  engine::LoadOptions load;       // The weights' dtype (and a precision map, TP, PP).
  int64_t kv_blocks = 0;          // Pool size in blocks; 0: as many as kv_memory_bytes holds.
  int64_t kv_memory_bytes = int64_t{256} << 20;
  int64_t block_size = 16;        // Prefill and decode workers must agree.
  // Tokens per step: a prefill's prompt tokens (longer prompts are
  // chunked); a decode or colocated step's decodes plus prefill chunks.
  int64_t token_budget = kDefaultMaxBatchTokens;
  // The knowledge tree of a prefill or colocated worker (on by default); a
  // decode worker keeps none and ignores it.
  PrefixCacheOptions cache;
  // Set: the weights to run on (LoadEngine loads none and sizes only the
  // pool): a flex worker's next role takes its last one's.
  std::shared_ptr<const LoadedModel> loaded;

  // served_model_name, else the model directory's name.
  std::string ServedName() const;
};

// The backend and the model loaded on it (the model goes first). Shared by
// the roles a flex worker serves in turn.
struct LoadedModel {
  kernels::KernelBackendPtr backend;
  std::unique_ptr<engine::Model> model;
};

// Loads the model (its weights as `load` says) on a CPU backend of `threads`.
absl::StatusOr<std::shared_ptr<const LoadedModel>> LoadModel(const EngineOptions& options);

// What a worker's engine runs on, in destruction order (pool, then the
// weights unless another role still holds them).
struct EngineResources {
  std::shared_ptr<const LoadedModel> loaded;
  std::unique_ptr<engine::BlockPool> pool;
  engine::Model* model() const { return loaded->model.get(); }
};

// The weights (`loaded`, or LoadModel's) and a pool sized by kv_blocks
// when > 0, else by as many blocks as kv_memory_bytes holds.
// InvalidArgument for a block size or token budget below 1, or a pool of
// no block.
absl::StatusOr<EngineResources> LoadEngine(const EngineOptions& options);

}  // namespace duet::worker

#endif  // DUET_WORKER_ENGINE_CORE_H_

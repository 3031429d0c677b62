#include "worker/engine_core.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace duet::worker {

std::string EngineOptions::ServedName() const {
  if (!served_model_name.empty()) return served_model_name;
  std::filesystem::path p(model_dir);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

absl::StatusOr<std::shared_ptr<const LoadedModel>> LoadModel(const EngineOptions& o) {
  auto m = std::make_shared<LoadedModel>();
  ASSIGN_OR_RETURN(m->backend, kernels::NewBackend(o.load.Backend(o.threads)));
  ASSIGN_OR_RETURN(m->model, engine::Model::Load(o.model_dir, m->backend.get(), o.load));
  LOG(INFO) << "weights of " << o.model_dir << " loaded";
  return std::shared_ptr<const LoadedModel>(std::move(m));
}

absl::StatusOr<EngineResources> LoadEngine(const EngineOptions& o) {
  if (o.block_size < 1) return absl::InvalidArgumentError("block_size must be >= 1");
  if (o.token_budget < 1) return absl::InvalidArgumentError("the token budget (--max-batch-tokens) must be >= 1");
  EngineResources r;
  if (o.loaded != nullptr) {
    r.loaded = o.loaded;
  } else {
    ASSIGN_OR_RETURN(r.loaded, LoadModel(o));
  }
  const kernels::KvLayout layout = r.model()->KvLayoutFor(o.block_size);
  const int64_t blocks = o.kv_blocks > 0 ? o.kv_blocks : engine::BlockPool::BlocksForBytes(layout, o.kv_memory_bytes);
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the KV pool would hold no block: kv_blocks = ", o.kv_blocks,
                                                   ", kv_memory_bytes = ", o.kv_memory_bytes, ", a block is ",
                                                   layout.BlockBytes(), " bytes"));
  }
  r.pool = std::make_unique<engine::BlockPool>(layout, blocks, r.loaded->backend->DefaultBufferType());
  return r;
}

}  // namespace duet::worker

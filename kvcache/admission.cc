#include "kvcache/admission.h"

namespace duet::kvcache {

absl::StatusOr<Admission> Admit(PrefixTree& tree, absl::Span<const int32_t> prefix, int64_t total_blocks,
                                const std::function<int64_t()>& free_blocks) {
  Admission a{.match = tree.Acquire(prefix, /*hit=*/false)};
  const int64_t need = total_blocks - a.match.device_tokens / tree.block_size();
  if (free_blocks() < need) tree.Evict(Tier::kDevice, need - free_blocks());
  absl::StatusOr<std::vector<int32_t>> blocks =
      free_blocks() < need ? absl::ResourceExhaustedError("no room for the sequence's blocks") : tree.SwapIn(a.match);
  if (!blocks.ok()) {
    tree.Release(a.match);
    return blocks.status();
  }
  a.blocks = std::move(*blocks);
  return a;
}

void Commit(PrefixTree& tree, const Admission& a, int64_t query_tokens, HitCounts* hits) {
  tree.Hit(a.match);
  hits->query_tokens += query_tokens;
  hits->hit_tokens[static_cast<int>(Tier::kDevice)] += a.match.device_tokens;
  hits->hit_tokens[static_cast<int>(Tier::kHost)] += a.match.tokens - a.match.device_tokens;
}

void Abandon(PrefixTree& tree, const Admission& a) { tree.Release(a.match); }

}  // namespace duet::kvcache

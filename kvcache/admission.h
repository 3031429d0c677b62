// The one admission call a scheduler makes of its prefix cache: match a
// prompt against the tree, pin the match, make room for the blocks the
// sequence still needs (evicting unpinned leaves), bring the match's host
// part back to device, and count the hit once the caller has used it. The
// prefill scheduler, the decode and colocated batch engine and the
// simulator's prefill instances all admit through it, so they find the same
// matches and count the same hits; none of them walks the tree.
//
//   ASSIGN_OR_RETURN(Admission a, Admit(tree, prompt_but_last, total_blocks, [&] { return pool.num_free(); }));
//   if (!seq.ShareBlocks(a.blocks).ok() || !seq.Reserve(n).ok()) { seq.Release(); Abandon(tree, a); return; }
//   Commit(tree, a, /*query_tokens=*/n, &hits);    // the match's nodes counted as hit
//   ...
//   tree.Release(a.match);                          // when the sequence (and any lease) ends
//
// Not thread-safe: the tree's owner calls it.
#ifndef DUET_KVCACHE_ADMISSION_H_
#define DUET_KVCACHE_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/prefix_tree.h"

namespace duet::kvcache {

// Prompt tokens asked of a cache and those it supplied, by tier: what every
// worker reports (duet_prefix_cache_*_tokens_total) and the simulator sums.
struct HitCounts {
  int64_t query_tokens = 0;
  int64_t hit_tokens[2] = {0, 0};  // by Tier
  int64_t hits(Tier t) const { return hit_tokens[static_cast<int>(t)]; }
};

// A pinned match and its blocks on device, in order.
struct Admission {
  Match match;
  std::vector<int32_t> blocks;
};

// Pins the longest cached prefix of `prefix` (the prompt without the
// tokens that must be computed: at least the last), evicts unpinned leaves
// until `free_blocks()` covers the `total_blocks` the sequence needs less
// the match's device blocks, and swaps the match's host part in. Pinned
// first, so the eviction spares what the match uses: with nothing else
// held, a sequence that fits the pool always fits. ResourceExhausted, with
// nothing left pinned, when the room cannot be made.
absl::StatusOr<Admission> Admit(PrefixTree& tree, absl::Span<const int32_t> prefix, int64_t total_blocks,
                                const std::function<int64_t()>& free_blocks);

// The caller took the admission: its nodes count a hit (frequency, PGDSF),
// and `hits` counts `query_tokens` asked and the match's tokens by tier.
void Commit(PrefixTree& tree, const Admission& a, int64_t query_tokens, HitCounts* hits);

// The caller could not take it (its own allocation failed): unpinned.
void Abandon(PrefixTree& tree, const Admission& a);

}  // namespace duet::kvcache

#endif  // DUET_KVCACHE_ADMISSION_H_

// The one hash of a token run's KV blocks, shared by the knowledge tree in
// every worker and by the router's view of those trees: block i's hash
// chains the hash of blocks 0..i-1 with block i's token ids, so equal hashes
// mean (up to a 64-bit collision) equal prefixes, not merely equal blocks.
//
//   std::vector<uint64_t> h = BlockHashes(prompt, /*block_size=*/16);
//   // h.size() == prompt.size() / 16; a partial last block has no hash.
//
// Deterministic across processes and builds (no per-process seed), so a
// hash computed by a worker means the same prefix to the router.
#ifndef DUET_KVCACHE_BLOCK_HASH_H_
#define DUET_KVCACHE_BLOCK_HASH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace duet::kvcache {

// The hash the empty prefix chains from.
inline constexpr uint64_t kRootHash = 0x6475657420726f6full;  // "duet roo"

// The hash of one full block of `tokens` after a prefix whose hash is `parent`.
uint64_t HashBlock(uint64_t parent, absl::Span<const int32_t> tokens);

// The chained hash of every full block of `tokens`.
std::vector<uint64_t> BlockHashes(absl::Span<const int32_t> tokens, int64_t block_size);

}  // namespace duet::kvcache

#endif  // DUET_KVCACHE_BLOCK_HASH_H_

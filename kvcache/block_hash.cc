#include "kvcache/block_hash.h"

namespace duet::kvcache {
namespace {

// SplitMix64's finalizer: a strong 64-bit mix, fixed across builds.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t HashBlock(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ (static_cast<uint64_t>(tokens.size()) << 32));
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

std::vector<uint64_t> BlockHashes(absl::Span<const int32_t> tokens, int64_t block_size) {
  std::vector<uint64_t> out;
  if (block_size <= 0) return out;
  out.reserve(tokens.size() / static_cast<size_t>(block_size));
  uint64_t h = kRootHash;
  for (size_t at = 0; at + static_cast<size_t>(block_size) <= tokens.size(); at += static_cast<size_t>(block_size)) {
    h = HashBlock(h, tokens.subspan(at, static_cast<size_t>(block_size)));
    out.push_back(h);
  }
  return out;
}

}  // namespace duet::kvcache

// Deterministic KV pool contents for transport tests. The UCX tests' blocks:
// every 8-byte word encodes (seed, block, epoch, word index), so a reader can
// tell exactly which block and which epoch each byte came from. The GPU
// tests' pools: 32-bit words of (seed, word index) over the whole pool.
//
//   FillBlock(pool + b * block_bytes, block_bytes, seed, b, epoch);
//   CHECK(PatternByte(seed, b, epoch, offset_in_block) == received[i]);
//   std::vector<uint32_t> want = PoolWords(seed, block * block_bytes / 4, block_bytes / 4);
//
// Test-only; thread-safe (pure functions).
#ifndef DUET_KVTRANSFER_TESTING_PATTERN_H_
#define DUET_KVTRANSFER_TESTING_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace duet::kvtransfer::testing {

uint64_t PatternWord(uint64_t seed, int32_t block, uint64_t epoch, uint64_t word);
// Byte `offset` of the block (little-endian words).
uint8_t PatternByte(uint64_t seed, int32_t block, uint64_t epoch, uint64_t offset);
// block_bytes must be a multiple of 8.
void FillBlock(uint8_t* dst, uint64_t block_bytes, uint64_t seed, int32_t block, uint64_t epoch);
// First offset in [begin, end) of the block whose byte differs from the
// pattern, or -1 when they all match.
int64_t FirstMismatch(const uint8_t* got, uint64_t seed, int32_t block, uint64_t epoch,
                      uint64_t begin, uint64_t end);

// The 32-bit word at index `word` of a pool filled with `seed` (a splitmix64
// finaliser: every word differs from its neighbours and from other seeds, so
// a misplaced or stale block never passes for the right one).
inline uint32_t PoolWord(uint64_t seed, uint64_t word) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + word + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// Words [first_word, first_word + num_words) of the pool.
std::vector<uint32_t> PoolWords(uint64_t seed, uint64_t first_word, size_t num_words);

}  // namespace duet::kvtransfer::testing

#endif  // DUET_KVTRANSFER_TESTING_PATTERN_H_

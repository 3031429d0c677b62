// Deterministic KV block contents for transport tests: every 8-byte word of
// a block encodes (seed, block, epoch, word index), so a reader can tell
// exactly which block and which epoch each byte came from.
//
//   FillBlock(pool + b * block_bytes, block_bytes, seed, b, epoch);
//   CHECK(PatternByte(seed, b, epoch, offset_in_block) == received[i]);
//
// Test-only; thread-safe (pure functions).
#ifndef DUET_KVTRANSFER_TESTING_PATTERN_H_
#define DUET_KVTRANSFER_TESTING_PATTERN_H_

#include <cstdint>

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

}  // namespace duet::kvtransfer::testing

#endif  // DUET_KVTRANSFER_TESTING_PATTERN_H_

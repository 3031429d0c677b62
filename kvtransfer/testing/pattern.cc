#include "kvtransfer/testing/pattern.h"

#include <cstring>

namespace duet::kvtransfer::testing {
namespace {
uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t PatternWord(uint64_t seed, int32_t block, uint64_t epoch, uint64_t word) {
  return Mix(Mix(Mix(seed ^ static_cast<uint64_t>(block)) + epoch) + word);
}

uint8_t PatternByte(uint64_t seed, int32_t block, uint64_t epoch, uint64_t offset) {
  return static_cast<uint8_t>(PatternWord(seed, block, epoch, offset / 8) >> (8 * (offset % 8)));
}

void FillBlock(uint8_t* dst, uint64_t block_bytes, uint64_t seed, int32_t block, uint64_t epoch) {
  uint64_t base = Mix(Mix(seed ^ static_cast<uint64_t>(block)) + epoch);
  for (uint64_t w = 0; w < block_bytes / 8; ++w) {
    uint64_t v = Mix(base + w);
    std::memcpy(dst + 8 * w, &v, 8);
  }
}

int64_t FirstMismatch(const uint8_t* got, uint64_t seed, int32_t block, uint64_t epoch,
                      uint64_t begin, uint64_t end) {
  uint64_t base = Mix(Mix(seed ^ static_cast<uint64_t>(block)) + epoch);
  uint64_t off = begin;
  while (off < end) {
    uint64_t w = off / 8;
    uint64_t v = Mix(base + w);
    uint64_t stop = (w + 1) * 8 < end ? (w + 1) * 8 : end;
    for (; off < stop; ++off) {
      if (got[off - begin] != static_cast<uint8_t>(v >> (8 * (off % 8)))) {
        return static_cast<int64_t>(off);
      }
    }
  }
  return -1;
}

std::vector<uint32_t> PoolWords(uint64_t seed, uint64_t first_word, size_t num_words) {
  std::vector<uint32_t> out(num_words);
  for (size_t i = 0; i < num_words; ++i) out[i] = PoolWord(seed, first_word + i);
  return out;
}

}  // namespace duet::kvtransfer::testing

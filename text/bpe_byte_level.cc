#include "text/bpe_byte_level.h"

#include <array>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace duet::text {
namespace {

// The table's code points all lie below this (the last is U+0143), so the
// inverse is a flat array rather than a map.
constexpr char32_t kTableLimit = 0x144;

struct ByteTable {
  std::array<char32_t, 256> code_point{};
  std::array<std::string, 256> utf8;
  std::array<int16_t, kTableLimit> inverse{};  // -1: not in the table.
};

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else {
    // Below U+0800: two bytes.
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const ByteTable& Table() {
  static const ByteTable* const table = [] {
    auto* t = new ByteTable;
    t->inverse.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      t->code_point[b] = printable(b) ? b : 256 + next++;
      AppendUtf8(t->code_point[b], &t->utf8[b]);
      t->inverse[t->code_point[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *table;
}

}  // namespace

char32_t ByteToUnicode(unsigned char byte) { return Table().code_point[byte]; }

std::string ByteLevelEncode(std::string_view bytes) {
  const ByteTable& table = Table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += table.utf8[static_cast<unsigned char>(c)];
  return out;
}

absl::StatusOr<std::string> ByteLevelDecode(std::string_view text) {
  const ByteTable& table = Table();
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto c0 = static_cast<unsigned char>(text[i]);
    char32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
      i += 2;
    } else {
      // Every table code point is below U+0800: two UTF-8 bytes at most.
      return absl::InvalidArgumentError(
          absl::StrCat("not byte-level text at offset ", i, ": ", std::string(text)));
    }
    const int byte = cp < kTableLimit ? table.inverse[cp] : -1;
    if (byte < 0) {
      return absl::InvalidArgumentError(absl::StrCat("code point U+",
                                                     absl::Hex(static_cast<uint32_t>(cp)),
                                                     " is outside the byte-level table"));
    }
    out.push_back(static_cast<char>(byte));
  }
  return out;
}

}  // namespace duet::text

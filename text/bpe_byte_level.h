// GPT-2's byte-level encoding: every byte gets a printable code point, so a
// byte-level BPE vocabulary is plain text (space is "Ġ", newline "Ċ").
//
// Shared by the BPE trainer (which writes vocabularies in this form) and the
// tokenizer (which reads them and maps tokens back to bytes).
//
//   std::string text = ByteLevelEncode(" a");             // "Ġa"
//   absl::StatusOr<std::string> bytes = ByteLevelDecode(text);  // " a"
//
// All functions are pure and thread-safe.
#ifndef DUET_ENGINE_BPE_BYTE_LEVEL_H_
#define DUET_ENGINE_BPE_BYTE_LEVEL_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace duet::text {

// GPT-2's pre-tokenizer regex, as written into tokenizer.json and as Hugging
// Face's ByteLevel pre-tokenizer applies it when use_regex is true.
inline constexpr char kGpt2SplitRegex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves,
// the other 68 bytes to U+0100.. in byte order (' ' -> U+0120 'Ġ').
char32_t ByteToUnicode(unsigned char byte);

// Maps each byte to its ByteToUnicode code point, UTF-8 encoded.
std::string ByteLevelEncode(std::string_view bytes);

// Inverse of ByteLevelEncode; InvalidArgument on a code point outside the
// table or malformed UTF-8.
absl::StatusOr<std::string> ByteLevelDecode(std::string_view text);

// Length of the UTF-8 character that starts with byte `lead` (1 for a
// continuation byte, so that a scan of malformed text still advances).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

}  // namespace duet::text

#endif  // DUET_ENGINE_BPE_BYTE_LEVEL_H_

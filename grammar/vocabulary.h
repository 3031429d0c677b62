// A tokenizer's vocabulary as the grammar engine walks it: every token's
// bytes in a trie, built once per tokenizer and shared by every grammar and
// request that uses the tokenizer.
//
// Three tries over the same tokens: all of them; the "plain" ones (only
// bytes a JSON string holds as they are: none below 0x20, no '"', no '\');
// and the rest whose first non-plain byte is '"' or '\' (what can leave or
// escape inside a string). Inside a string the matcher takes the plain
// tokens from a mask computed once per string state and walks only the
// third trie. Special tokens (added tokens marked special) are in no trie:
// the mask allows only the end-of-sequence ids, and only where the grammar
// may end.
//
//   ASSIGN_OR_RETURN(auto vocab, Vocabulary::FromTokenizer(*tokenizer, {eos_id}));
#ifndef DUET_GRAMMAR_VOCABULARY_H_
#define DUET_GRAMMAR_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "text/tokenizer.h"

namespace duet::grammar {

// Tokens' bytes in preorder: node i holds `byte[i]` at `depth[i]` (1 for a
// token's first byte), its subtree ends before `skip[i]`, and the ids of
// the tokens that end at it are ids[tok_begin[i] .. tok_begin[i + 1]).
struct TokenTrie {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<int32_t> skip;
  std::vector<int32_t> tok_begin;
  std::vector<int32_t> ids;
  int32_t max_depth = 0;
  int32_t size() const { return static_cast<int32_t>(byte.size()); }
};

inline bool IsPlainStringByte(uint8_t b) { return b >= 0x20 && b != '"' && b != '\\'; }

class Vocabulary {
 public:
  // token_bytes[id] is what id stands for in a text; special ids are never
  // generated inside a grammar; eos_ids end it.
  Vocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& special, std::vector<int32_t> eos_ids);
  // A model's EOS ids as its config lists them: those past the tokenizer's
  // vocabulary (a model may have more embedding rows) are left out, a
  // negative one is InvalidArgument.
  static absl::StatusOr<std::shared_ptr<const Vocabulary>> FromTokenizer(const text::Tokenizer& tokenizer,
                                                                         std::vector<int32_t> eos_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t mask_words() const { return (size() + 63) / 64; }
  // What id stands for inside a grammar: empty for special tokens.
  std::string_view bytes(int32_t id) const { return bytes_[id]; }
  // What id stands for in the output's text, special tokens too (their
  // content); empty outside the vocabulary.
  std::string_view text(int32_t id) const;
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  const TokenTrie& all() const { return all_; }
  const TokenTrie& plain() const { return plain_; }
  const TokenTrie& string_exits() const { return exits_; }
  // Code points in the longest plain token: a string with room for this
  // many more takes every plain token that fits its other constraints.
  int32_t max_plain_chars() const { return max_plain_chars_; }

  // The plain tokens valid as UTF-8 from Utf8Step state `pending`, with at
  // most `room` code points (-1: any): once per arguments.
  const uint64_t* FreePlainMask(int32_t pending, int64_t room) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  absl::flat_hash_map<int32_t, std::string> special_text_;
  TokenTrie all_, plain_, exits_;
  int32_t max_plain_chars_ = 0;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<int64_t, std::unique_ptr<std::vector<uint64_t>>> free_masks_ ABSL_GUARDED_BY(mu_);
};

// One step of UTF-8 validation inside a string, exact as RFC 3629 (no
// overlong forms, no surrogates, nothing past U+10FFFF): `pending` is 0 at
// a character boundary, else the continuation bytes owed (low 2 bits) and
// the range the next one must fall in (bits 2-4). Returns the state after
// `b`, or -1 when b is invalid there; *starts is set when b starts a code
// point.
inline int32_t Utf8Step(int32_t pending, uint8_t b, bool* starts) {
  static constexpr uint8_t kLo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
  static constexpr uint8_t kHi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  *starts = false;
  if (pending > 0) {
    const int32_t range = pending >> 2;
    if (b < kLo[range] || b > kHi[range]) return -1;
    return (pending & 3) - 1;
  }
  *starts = true;
  if (b < 0x80) return 0;
  if (b >= 0xC2 && b <= 0xDF) return 1;
  if (b == 0xE0) return 2 | (1 << 2);
  if (b == 0xED) return 2 | (2 << 2);
  if (b >= 0xE1 && b <= 0xEF) return 2;
  if (b == 0xF0) return 3 | (3 << 2);
  if (b >= 0xF1 && b <= 0xF3) return 3;
  if (b == 0xF4) return 3 | (4 << 2);
  return -1;
}
constexpr int32_t kUtf8States = 20;  // pending values Utf8Step returns are below this

// Walks a plain-token trie with a per-byte predicate over a small state and
// sets the bits of the tokens it accepts. `step(state, byte, &next)` returns
// false to cut the subtree.
template <typename State, typename Step>
void WalkPlainTrie(const TokenTrie& trie, State root, Step step, uint64_t* mask) {
  std::vector<State> level(trie.max_depth + 1);
  level[0] = root;
  for (int32_t i = 0; i < trie.size();) {
    const int d = trie.depth[i];
    if (!step(level[d - 1], trie.byte[i], &level[d])) {
      i = trie.skip[i];
      continue;
    }
    for (int32_t k = trie.tok_begin[i]; k < trie.tok_begin[i + 1]; ++k) {
      const int32_t id = trie.ids[k];
      mask[id / 64] |= uint64_t{1} << (id % 64);
    }
    ++i;
  }
}

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_VOCABULARY_H_

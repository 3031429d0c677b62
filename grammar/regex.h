// Regular expressions (ECMA-262 syntax, as JSON Schema's `pattern` writes
// them) compiled to a DFA over UTF-8 bytes, built eagerly and immutable.
//
// A JSON Schema pattern is a search: it matches a string when it matches
// somewhere in it, unless `^` / `$` anchor it. A `ByteDfa` runs over the
// string's decoded bytes (the matcher decodes JSON escapes before feeding
// it). Accepting states carry tags, so one DFA can classify a string at once
// against several patterns and literal names (an object's keys).
//
//   ASSIGN_OR_RETURN(ByteDfa dfa, CompileRegex("^[a-z]+$"));
//   int32_t s = dfa.Next(dfa.start(), 'a');  // kDead when no match can follow
#ifndef DUET_GRAMMAR_REGEX_H_
#define DUET_GRAMMAR_REGEX_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace duet::grammar {

class ByteDfa {
 public:
  static constexpr int32_t kDead = -1;

  int32_t start() const { return 0; }
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * num_classes_ + class_of_[byte]];
  }
  // Tags of the alternatives that match a string ending in `state`, sorted.
  absl::Span<const int32_t> Tags(int32_t state) const {
    return {tags_.data() + tag_begin_[state], static_cast<size_t>(tag_begin_[state + 1] - tag_begin_[state])};
  }
  bool Accepting(int32_t state) const { return tag_begin_[state + 1] > tag_begin_[state]; }
  // Whether the whole of `s`, from the start state, ends in an accepting state.
  bool Matches(std::string_view s) const;
  // Whether some continuation from `state` matches an alternative tagged in [lo, hi].
  bool CanReachTag(int32_t state, int32_t lo, int32_t hi) const;
  int32_t num_states() const { return num_states_; }
  int32_t num_tags() const { return num_tags_; }

 private:
  friend class DfaBuilder;
  int32_t num_states_ = 0;
  int32_t num_classes_ = 1;
  int32_t num_tags_ = 0;
  std::array<uint8_t, 256> class_of_{};
  std::vector<int32_t> next_;       // num_states_ x num_classes_
  std::vector<int32_t> tag_begin_;  // num_states_ + 1
  std::vector<int32_t> tags_;
  std::vector<uint64_t> reach_;  // num_states_ x words: tags reachable
  int32_t reach_words_ = 0;
};

// One alternative of a tagged DFA: a pattern (search semantics) or a literal
// string (matched whole).
struct DfaAlternative {
  enum class Kind { kPattern, kLiteral, kAnything };
  Kind kind;
  std::string text;
  int32_t tag;
};

// Writes cp's UTF-8 bytes to out (room for 4) and returns how many.
int EncodeUtf8(uint32_t cp, uint8_t* out);

// The DFA of one pattern; its only tag is 0. InvalidArgument names what in
// the pattern is not supported (lookaround, backreferences, word boundaries)
// or malformed.
absl::StatusOr<ByteDfa> CompileRegex(std::string_view pattern);
// The DFA of several alternatives at once, each accepting with its own tag.
absl::StatusOr<ByteDfa> CompileAlternatives(absl::Span<const DfaAlternative> alternatives);

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_REGEX_H_

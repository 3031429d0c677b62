// PCRE2 regexes for the tokenizer's pre-tokenization, iterated the way
// Hugging Face tokenizers iterates its (Oniguruma) regexes, and the Split
// pre-tokenizer built on them.
//
//   ASSIGN_OR_RETURN(auto re, SplitRegex::Compile(kGpt2SplitRegex));
//   RETURN_IF_ERROR(SplitPieces(*re, text, SplitBehavior::kIsolated, false,
//                               [&](std::string_view piece) { ... }));
//
// Patterns run in UTF + UCP mode (\p{L}, \s, \w and case folding are
// Unicode-aware) and are JIT-compiled when the platform allows. Known
// difference from Oniguruma: PCRE2's \s also matches U+180E. A compiled
// SplitRegex is immutable and thread-safe. Internal to text:tokenizer.
#ifndef DUET_ENGINE_TOKENIZER_REGEX_H_
#define DUET_ENGINE_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet::text {

class SplitRegex {
 public:
  // A regex, or with `literal` a plain string to find. InvalidArgument
  // carries PCRE2's message and the offset in the pattern.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(std::string_view pattern,
                                                             bool literal = false);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Calls on_match(begin, end) for each non-overlapping match in `subject`,
  // which must be valid UTF-8, left to right. After an empty match the next
  // search starts one character later, and an empty match right where the
  // previous match ended is dropped (Rust regex's find_iter rule, which
  // Hugging Face inherits). on_match may itself call ForEachMatch on any
  // regex. Errors only when PCRE2 gives up (resource limits).
  absl::Status ForEachMatch(std::string_view subject,
                            absl::FunctionRef<void(size_t, size_t)> on_match) const;

 private:
  struct Impl;
  explicit SplitRegex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What Split does with the matches, as Hugging Face's SplitDelimiterBehavior.
enum class SplitBehavior {
  kIsolated,            // Matches and the gaps between them each become a piece.
  kRemoved,             // Gaps become pieces; matches are dropped.
  kMergedWithPrevious,  // A match joins the piece before it ("a " "b").
  kMergedWithNext,      // A match joins the piece after it ("a" " b").
  kContiguous,          // Runs of matches, and of gaps, each become a piece.
};

// Hugging Face's Split pre-tokenizer: cuts `text` at the matches of `re`
// and calls on_piece for each non-empty piece in order. `invert` swaps the
// roles of matches and gaps.
absl::Status SplitPieces(const SplitRegex& re, std::string_view text, SplitBehavior behavior,
                         bool invert, absl::FunctionRef<void(std::string_view)> on_piece);

}  // namespace duet::text

#endif  // DUET_ENGINE_TOKENIZER_REGEX_H_

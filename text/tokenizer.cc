#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "text/bpe_byte_level.h"
#include "text/bpe_model.h"
#include "text/tokenizer_regex.h"

namespace duet::text {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Ids index flat tables; a larger id is a corrupt file (real vocabularies
// stay below 300k).
constexpr int64_t kMaxId = int64_t{1} << 24;
constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// Debian's abseil has its own string_view, which heterogeneous lookup needs.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// ---------------------------------------------------------------------------
// UTF-8.

enum class SeqKind { kValid, kInvalid, kTruncated };

// Classifies the sequence at text[i] and sets *len to its length. An invalid
// sequence is one maximal subpart (the Unicode / WHATWG "replace" unit); a
// truncated one is a valid prefix cut off by the end of `text`.
SeqKind NextSequence(std::string_view text, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) {
    *len = 1;
    return SeqKind::kValid;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // Range of the second byte.
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;  // No overlong forms.
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;  // No surrogates.
  } else if (c >= 0xE1 && c <= 0xEF) {
    need = 2;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;  // Nothing above U+10FFFF.
  } else {
    *len = 1;
    return SeqKind::kInvalid;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= text.size()) {
      *len = j - i;
      return SeqKind::kTruncated;
    }
    const auto d = static_cast<unsigned char>(text[j]);
    if (d < lo || d > hi) {
      *len = j - i;
      return SeqKind::kInvalid;
    }
    lo = 0x80, hi = 0xBF;
  }
  *len = j - i;
  return SeqKind::kValid;
}

// Offset of the first byte that is not part of a valid character, or npos.
size_t FirstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // ASCII runs, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    size_t len;
    if (NextSequence(text, i, &len) != SeqKind::kValid) return i;
    i += len;
  }
  return std::string_view::npos;
}

// Decodes the (valid) character at text[i].
char32_t DecodeAt(std::string_view text, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(text[i]);
  *len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (*len == 1) return c;
  char32_t cp = c & (0x7F >> *len);
  for (size_t k = 1; k < *len; ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  }
  return cp;
}

// Decodes the (valid) character that ends just before text[end].
char32_t DecodeBefore(std::string_view text, size_t end, size_t* len) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return DecodeAt(text, begin, len);
}

// Rust's regex \s and \w (Unicode), which Hugging Face's added-token options
// use: White_Space; Alphabetic, marks, decimal digits, connector punctuation
// and Join_Control.
bool IsUnicodeSpace(char32_t c) { return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE); }
bool IsWordChar(char32_t c) {
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) ||
         (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

// ---------------------------------------------------------------------------
// Added tokens.

struct AddedTokenSpec {
  AddedToken token;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// Finds added tokens in text the way Hugging Face's AddedVocabulary does: an
// Aho-Corasick-style leftmost-longest scan (here a byte trie walked from each
// position whose byte can start a token), then single_word, lstrip and
// rstrip applied to each match.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() { nodes_.push_back(-1); }

  void Add(std::string_view pattern, int spec_index) {
    if (pattern.empty()) return;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (char c : pattern) {
      auto [it, inserted] =
          edges_.try_emplace(EdgeKey(node, c), static_cast<int32_t>(nodes_.size()));
      if (inserted) nodes_.push_back(-1);
      node = it->second;
    }
    // The first token with this content keeps it.
    if (nodes_[node] < 0) nodes_[node] = spec_index;
    empty_ = false;
  }

  // Calls on_piece(piece, id) over `text` in order: id is the added token's,
  // or -1 for the text between tokens. Empty pieces are skipped.
  void Split(std::string_view text, const std::vector<AddedTokenSpec>& specs,
             absl::FunctionRef<void(std::string_view, int32_t)> on_piece) const {
    const size_t n = text.size();
    if (empty_) {
      if (n > 0) on_piece(text, -1);
      return;
    }
    size_t emitted = 0;  // Hugging Face's start_offset.
    size_t pos = 0;
    while (pos < n) {
      while (pos < n && !first_byte_[static_cast<unsigned char>(text[pos])]) ++pos;
      if (pos >= n) break;
      int spec_index = -1;
      size_t match_len = 0;
      int32_t node = 0;
      for (size_t j = pos; j < n; ++j) {
        auto it = edges_.find(EdgeKey(node, text[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (nodes_[node] >= 0) {
          spec_index = nodes_[node];
          match_len = j + 1 - pos;
        }
      }
      if (spec_index < 0) {
        ++pos;
        continue;
      }
      size_t begin = pos;
      size_t end = pos + match_len;
      pos = end;  // The scan resumes after the match, kept or not.
      const AddedTokenSpec& spec = specs[spec_index];
      size_t len;
      if (spec.single_word) {
        const bool word_before = begin > 0 && IsWordChar(DecodeBefore(text, begin, &len));
        const bool word_after = end < n && IsWordChar(DecodeAt(text, end, &len));
        if (word_before || word_after) continue;
      }
      if (spec.lstrip) {
        // Spaces already inside the previous piece's token stay there.
        while (begin > emitted && IsUnicodeSpace(DecodeBefore(text, begin, &len))) begin -= len;
      }
      if (spec.rstrip) {
        while (end < n && IsUnicodeSpace(DecodeAt(text, end, &len))) end += len;
        // Hugging Face resumes inside the stripped spaces and could emit
        // overlapping pieces; resuming after them keeps the pieces a cover.
        pos = end;
      }
      if (emitted < begin) on_piece(text.substr(emitted, begin - emitted), -1);
      on_piece(text.substr(begin, end - begin), spec.token.id);
      emitted = end;
    }
    if (emitted < n) on_piece(text.substr(emitted), -1);
  }

 private:
  static uint64_t EdgeKey(int32_t node, char c) {
    return (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }
  bool empty_ = true;
  std::array<bool, 256> first_byte_{};
  std::vector<int32_t> nodes_;  // Node -> index into specs, or -1.
  absl::flat_hash_map<uint64_t, int32_t> edges_;
};

// ---------------------------------------------------------------------------
// The tokenizer.

// One normalizer of the chain, applied in order.
struct NormalizerStep {
  enum class Kind { kUnicode, kPrepend, kReplace };
  Kind kind = Kind::kUnicode;
  const icu::Normalizer2* unicode = nullptr;  // kUnicode: NFC, NFKC, NFD or NFKD.
  // kUnicode: text whose bytes are all below this is already normalized.
  unsigned char unchanged_below = 0x80;
  std::string pattern;  // kReplace: what is replaced (a literal string).
  std::string content;  // kPrepend: what is put before; kReplace: the replacement.
};

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  Kind kind = Kind::kSplit;
  // Split's pattern; ByteLevel's regex (null without use_regex); Metaspace's
  // replacement as a literal (null without split).
  std::unique_ptr<SplitRegex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only.
  std::string replacement;        // Metaspace only.
  Prepend prepend = Prepend::kAlways;  // Metaspace only.
};

// How ids become text: steps applied to each token's spelling, then (after a
// Fuse) a strip at the ends of the whole text.
struct DecoderSpec {
  struct TokenStep {
    enum class Kind { kByteLevel, kByteFallback, kReplace, kStrip };
    Kind kind = Kind::kByteLevel;
    std::string pattern, content;  // kReplace: pattern -> content; kStrip: content.
    int start = 0, stop = 0;       // kStrip: how many to strip at each end.
  };
  std::vector<TokenStep> per_token;
  bool fused = false;      // A Fuse seen: later steps see the whole text.
  std::string strip;       // Stripped from the whole text's ends...
  int strip_start = 0;     // ... up to this many times at the start
  int strip_stop = 0;      // ... and at the end.
};

// Everything a loader gathers; BpeTokenizer::Create checks and indexes it.
struct TokenizerSpec {
  // Token -> id, tokens in byte-level form unless model_options.char_level.
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  BpeModel::Options model_options;
  bool byte_fallback = false;
  std::vector<AddedTokenSpec> added;
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  DecoderSpec decoder;
};

// Per-Encode buffers, so that Encode allocates little and shares nothing.
struct EncodeScratch {
  std::array<std::string, 2> normalized;  // Normalizers alternate between them.
  std::string prefixed;  // ByteLevel's add_prefix_space.
};

// `text` less up to `start` copies of `affix` at its start and `stop` at its end.
std::string_view StripAffix(std::string_view text, std::string_view affix, int start, int stop) {
  absl::string_view rest = AbslView(text);
  if (!affix.empty()) {
    for (int i = 0; i < start && absl::ConsumePrefix(&rest, AbslView(affix)); ++i) {
    }
    for (int i = 0; i < stop && absl::ConsumeSuffix(&rest, AbslView(affix)); ++i) {
    }
  }
  return std::string_view(rest.data(), rest.size());
}

// The byte a byte-fallback token "<0xXX>" stands for, or -1.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

// What one token's spelling decodes to under the per-token steps. Added
// tokens keep their bytes through the byte-level and byte-fallback steps.
std::string DecodeToken(std::string_view token, const DecoderSpec& decoder, bool added) {
  std::string text(token);
  for (const DecoderSpec::TokenStep& step : decoder.per_token) {
    switch (step.kind) {
      case DecoderSpec::TokenStep::Kind::kByteLevel:
        if (added) break;
        // A token outside the byte-level alphabet decodes to its own UTF-8,
        // as Hugging Face's ByteLevel decoder does.
        if (absl::StatusOr<std::string> raw = ByteLevelDecode(text); raw.ok()) text = *std::move(raw);
        break;
      case DecoderSpec::TokenStep::Kind::kByteFallback:
        if (added) break;
        if (const int b = ByteFallbackValue(text); b >= 0) text.assign(1, static_cast<char>(b));
        break;
      case DecoderSpec::TokenStep::Kind::kReplace:
        text = absl::StrReplaceAll(text, {{step.pattern, step.content}});
        break;
      case DecoderSpec::TokenStep::Kind::kStrip:
        text = std::string(StripAffix(text, step.content, step.start, step.stop));
        break;
    }
  }
  return text;
}

class BpeTokenizer final : public Tokenizer {
 public:
  // describe_merge may read spec.merges: Create moves from `spec` only
  // after the merges are checked.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(
      TokenizerSpec&& spec, absl::FunctionRef<std::string(size_t)> describe_merge,
      const std::string& source);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override;
  absl::StatusOr<std::string> DecodeBytes(absl::Span<const int32_t> ids,
                                          bool skip_special) const override;
  absl::StatusOr<std::string_view> TokenBytes(int32_t id, bool skip_special) const override;
  int32_t TokenToId(std::string_view token) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  const std::vector<AddedToken>& added_tokens() const override { return added_tokens_; }

 private:
  enum class IdKind : uint8_t { kNone, kModel, kAdded, kSpecial };

  // `first`: the text starts where the encoded text does (Metaspace's
  // prepend_scheme "first" looks at it).
  absl::Status EncodeUnmatched(std::string_view text, bool first, EncodeScratch& scratch,
                               std::vector<int32_t>* ids) const;
  absl::Status PreTokenize(std::string_view piece, size_t step, bool first, EncodeScratch& scratch,
                           std::vector<int32_t>* ids) const;
  // The normalized text: `text` itself, or one of the scratch buffers.
  absl::StatusOr<std::string_view> Normalize(std::string_view text,
                                             std::array<std::string, 2>& buffers) const;

  std::unique_ptr<BpeModel> model_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  // The decoder's strip at the ends of the whole text.
  std::string strip_;
  int strip_start_ = 0;
  int strip_stop_ = 0;
  std::vector<AddedTokenSpec> added_specs_;
  std::vector<AddedToken> added_tokens_;
  // Added tokens matched in the raw text, and those (normalized: true)
  // matched in the normalized text between them.
  AddedTokenMatcher raw_matcher_;
  AddedTokenMatcher normalized_matcher_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<std::string, int32_t> added_ids_;
  // The bytes each id decodes to: id_bytes_[id_offsets_[id], id_offsets_[id + 1]).
  std::string id_bytes_;
  std::vector<uint32_t> id_offsets_;
  std::vector<IdKind> id_kinds_;
  int64_t vocab_size_ = 0;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(
    TokenizerSpec&& spec, absl::FunctionRef<std::string(size_t)> describe_merge,
    const std::string& source) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer);
  ASSIGN_OR_RETURN(t->model_, BpeModel::Create(spec.vocab, spec.merges, spec.model_options,
                                               spec.byte_fallback, describe_merge));
  t->normalizer_ = std::move(spec.normalizer);

  int64_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedTokenSpec& a : spec.added) max_id = std::max<int64_t>(max_id, a.token.id);
  t->vocab_size_ = max_id + 1;

  // Decoded bytes per id, through the decoder's per-token steps.
  std::vector<std::string_view> text_of(t->vocab_size_);
  std::vector<IdKind> kinds(t->vocab_size_, IdKind::kNone);
  for (const auto& [token, id] : spec.vocab) {
    // Of two tokens sharing an id, keep the smaller one, deterministically.
    if (kinds[id] == IdKind::kNone || token < text_of[id]) text_of[id] = token;
    kinds[id] = IdKind::kModel;
  }
  for (const AddedTokenSpec& a : spec.added) {
    text_of[a.token.id] = a.token.content;
    kinds[a.token.id] = a.token.special ? IdKind::kSpecial : IdKind::kAdded;
  }
  t->id_offsets_.reserve(t->vocab_size_ + 1);
  t->id_offsets_.push_back(0);
  for (int64_t id = 0; id < t->vocab_size_; ++id) {
    if (kinds[id] != IdKind::kNone) {
      t->id_bytes_.append(DecodeToken(text_of[id], spec.decoder, /*added=*/kinds[id] != IdKind::kModel));
    }
    if (t->id_bytes_.size() > UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": vocabulary too large"));
    }
    t->id_offsets_.push_back(static_cast<uint32_t>(t->id_bytes_.size()));
  }
  t->id_kinds_ = std::move(kinds);

  for (size_t i = 0; i < spec.added.size(); ++i) {
    const AddedTokenSpec& a = spec.added[i];
    t->added_ids_.insert_or_assign(a.token.content, a.token.id);
    if (!a.normalized || t->normalizer_.empty()) {
      t->raw_matcher_.Add(a.token.content, static_cast<int>(i));
    } else {
      // Hugging Face matches these in normalized text, so it normalizes
      // their content too (Prepend included).
      std::array<std::string, 2> scratch;
      ASSIGN_OR_RETURN(std::string_view pattern, t->Normalize(a.token.content, scratch));
      t->normalized_matcher_.Add(pattern, static_cast<int>(i));
    }
    t->added_tokens_.push_back(a.token);
  }
  t->added_specs_ = std::move(spec.added);
  t->vocab_ = std::move(spec.vocab);
  t->pre_tokenizer_ = std::move(spec.pre_tokenizer);
  t->strip_ = std::move(spec.decoder.strip);
  t->strip_start_ = spec.decoder.strip_start;
  t->strip_stop_ = spec.decoder.strip_stop;
  return std::unique_ptr<Tokenizer>(std::move(t));
}

absl::StatusOr<std::string_view> BpeTokenizer::Normalize(std::string_view text,
                                                         std::array<std::string, 2>& buffers) const {
  std::string_view current = text;
  for (const NormalizerStep& step : normalizer_) {
    // Each result goes to the buffer `current` is not in.
    std::string& out = current.data() == buffers[0].data() ? buffers[1] : buffers[0];
    switch (step.kind) {
      case NormalizerStep::Kind::kUnicode: {
        const unsigned char below = step.unchanged_below;
        if (std::all_of(current.begin(), current.end(),
                        [below](char c) { return static_cast<unsigned char>(c) < below; })) {
          continue;
        }
        const icu::StringPiece piece(current.data(), static_cast<int32_t>(current.size()));
        UErrorCode status = U_ZERO_ERROR;
        if (step.unicode->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) continue;
        out.clear();
        icu::StringByteSink<std::string> sink(&out);
        status = U_ZERO_ERROR;
        step.unicode->normalizeUTF8(0, piece, sink, nullptr, status);
        if (U_FAILURE(status)) {
          return absl::InternalError(absl::StrCat("Unicode normalization failed: ", u_errorName(status)));
        }
        break;
      }
      case NormalizerStep::Kind::kPrepend:
        if (current.empty()) continue;  // Hugging Face prepends only to non-empty text.
        out.assign(step.content).append(current);
        break;
      case NormalizerStep::Kind::kReplace:
        if (current.find(step.pattern) == std::string_view::npos) continue;
        out = absl::StrReplaceAll(AbslView(current), {{step.pattern, step.content}});
        break;
    }
    current = out;
  }
  return current;
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text) const {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8 at byte offset ", bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  EncodeScratch scratch;
  absl::Status status;
  raw_matcher_.Split(text, added_specs_, [&](std::string_view piece, int32_t id) {
    if (!status.ok()) return;
    if (id >= 0) {
      ids.push_back(id);
    } else {
      status = EncodeUnmatched(piece, /*first=*/piece.data() == text.data(), scratch, &ids);
    }
  });
  RETURN_IF_ERROR(status);
  return ids;
}

// Text between raw-matched added tokens: normalize, find the normalized
// added tokens, pre-tokenize and merge the rest.
absl::Status BpeTokenizer::EncodeUnmatched(std::string_view text, bool first, EncodeScratch& scratch,
                                           std::vector<int32_t>* ids) const {
  ASSIGN_OR_RETURN(std::string_view normalized, Normalize(text, scratch.normalized));
  absl::Status status;
  normalized_matcher_.Split(normalized, added_specs_, [&](std::string_view piece, int32_t id) {
    if (!status.ok()) return;
    if (id >= 0) {
      ids->push_back(id);
    } else {
      status = PreTokenize(piece, 0, first && piece.data() == normalized.data(), scratch, ids);
    }
  });
  return status;
}

absl::Status BpeTokenizer::PreTokenize(std::string_view piece, size_t step, bool first,
                                       EncodeScratch& scratch, std::vector<int32_t>* ids) const {
  if (piece.empty()) return absl::OkStatus();
  if (step == pre_tokenizer_.size()) {
    model_->Encode(piece, ids);
    return absl::OkStatus();
  }
  const PreTokenizerStep& s = pre_tokenizer_[step];
  std::string metaspaced;  // Metaspace's rewrite of the piece.
  if (s.kind == PreTokenizerStep::Kind::kByteLevel) {
    // Safe to reuse one buffer: ByteLevel is the last step (checked on load).
    if (s.add_prefix_space && piece[0] != ' ') {
      scratch.prefixed.assign(1, ' ').append(piece);
      piece = scratch.prefixed;
    }
    if (s.regex == nullptr) return PreTokenize(piece, step + 1, first, scratch, ids);
  } else if (s.kind == PreTokenizerStep::Kind::kMetaspace) {
    metaspaced = absl::StrReplaceAll(AbslView(piece), {{" ", s.replacement}});
    const bool prepend = s.prepend == PreTokenizerStep::Prepend::kAlways ||
                         (s.prepend == PreTokenizerStep::Prepend::kFirst && first);
    if (prepend && !absl::StartsWith(metaspaced, s.replacement)) metaspaced.insert(0, s.replacement);
    piece = metaspaced;
    if (s.regex == nullptr) return PreTokenize(piece, step + 1, first, scratch, ids);
  }
  absl::Status inner;
  RETURN_IF_ERROR(SplitPieces(*s.regex, piece, s.behavior, s.invert, [&](std::string_view sub) {
    if (inner.ok()) inner = PreTokenize(sub, step + 1, first && sub.data() == piece.data(), scratch, ids);
  }));
  return inner;
}

absl::StatusOr<std::string> BpeTokenizer::DecodeBytes(absl::Span<const int32_t> ids,
                                                      bool skip_special) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::string_view bytes, TokenBytes(id, skip_special));
    out.append(bytes);
  }
  if (strip_start_ > 0 || strip_stop_ > 0) {
    const std::string_view kept = StripAffix(out, strip_, strip_start_, strip_stop_);
    if (kept.size() != out.size()) out = std::string(kept);
  }
  return out;
}

absl::StatusOr<std::string_view> BpeTokenizer::TokenBytes(int32_t id, bool skip_special) const {
  if (id < 0 || id >= vocab_size_ || id_kinds_[id] == IdKind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
  }
  if (skip_special && id_kinds_[id] == IdKind::kSpecial) return std::string_view();
  return std::string_view(id_bytes_).substr(id_offsets_[id], id_offsets_[id + 1] - id_offsets_[id]);
}

int32_t BpeTokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(AbslView(token)); it != added_ids_.end()) return it->second;
  if (auto it = vocab_.find(AbslView(token)); it != vocab_.end()) return it->second;
  return -1;
}

// ---------------------------------------------------------------------------
// Reading tokenizer.json.

absl::Status FieldError(const std::string& source, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, " ", problem));
}

absl::StatusOr<Json> ParseJson(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
  }
}

// The member `key` of `object`, or nullptr when absent or null.
const Json* Member(const Json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<bool> BoolMember(const Json& object, const char* key, bool fallback,
                                const std::string& source, const std::string& field) {
  const Json* v = Member(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return FieldError(source, absl::StrCat(field, ".", key), "is not a boolean");
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> TypeOf(const Json& node, const std::string& source,
                                   const std::string& field) {
  if (!node.is_object()) return FieldError(source, field, "is not an object");
  const Json* type = Member(node, "type");
  if (type == nullptr || !type->is_string()) {
    return FieldError(source, absl::StrCat(field, ".type"), "is missing or not a string");
  }
  return type->get<std::string>();
}

absl::Status Unsupported(const std::string& source, const std::string& field,
                         const std::string& type) {
  return FieldError(source, absl::StrCat(field, ".type \"", type, "\""), "is not supported");
}

absl::StatusOr<int32_t> IdValue(const Json& v, const std::string& source,
                                const std::string& field) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
    return FieldError(source, field, absl::StrCat("is not a token id in [0, ", kMaxId, ")"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

absl::StatusOr<std::string> StringMember(const Json& object, const char* key, const std::string& source,
                                         const std::string& field) {
  const Json* v = Member(object, key);
  if (v == nullptr || !v->is_string()) {
    return FieldError(source, absl::StrCat(field, ".", key), "is missing or not a string");
  }
  return v->get<std::string>();
}

// A Replace's or Split's literal pattern, {"String": s}; a regex one is
// refused where only literals are supported.
absl::StatusOr<std::string> StringPattern(const Json& node, const std::string& source, const std::string& field) {
  const Json* pattern = Member(node, "pattern");
  const Json* literal = pattern != nullptr && pattern->is_object() ? Member(*pattern, "String") : nullptr;
  if (literal == nullptr || !literal->is_string() || literal->get_ref<const std::string&>().empty()) {
    return FieldError(source, field + ".pattern",
                      "is not {\"String\": non-empty string} (a Regex pattern is not supported here)");
  }
  return literal->get<std::string>();
}

// A Sequence's member `key`: calls parse(item, "FIELD.KEY[i]") on each item.
absl::Status ForEachInList(const Json& node, const char* key, const std::string& source, const std::string& field,
                           absl::FunctionRef<absl::Status(const Json&, const std::string&)> parse) {
  const Json* list = Member(node, key);
  if (list == nullptr || !list->is_array()) {
    return FieldError(source, absl::StrCat(field, ".", key), "is missing or not an array");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    RETURN_IF_ERROR(parse((*list)[i], absl::StrCat(field, ".", key, "[", i, "]")));
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const Json& node, const std::string& source, const std::string& field,
                             std::vector<NormalizerStep>* steps) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(node, source, field));
  if (type == "Sequence") {
    return ForEachInList(node, "normalizers", source, field, [&](const Json& item, const std::string& where) {
      return ParseNormalizer(item, source, where, steps);
    });
  }
  NormalizerStep step;
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    UErrorCode status = U_ZERO_ERROR;
    step.unicode = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                   : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                   : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                    : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status)) {
      return absl::InternalError(absl::StrCat("ICU ", type, " normalizer: ", u_errorName(status)));
    }
    // Nothing below U+0300 (lead byte 0xCC) changes or combines under NFC;
    // the other forms leave only ASCII alone.
    step.unchanged_below = type == "NFC" ? 0xCC : 0x80;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    ASSIGN_OR_RETURN(step.content, StringMember(node, "prepend", source, field));
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    ASSIGN_OR_RETURN(step.pattern, StringPattern(node, source, field));
    ASSIGN_OR_RETURN(step.content, StringMember(node, "content", source, field));
  } else {
    return Unsupported(source, field, type);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

// The fields Metaspace's pre-tokenizer and decoder share: the replacement
// (U+2581 when left out) and prepend_scheme, or in older files
// add_prefix_space (true: "always"); "always" when neither is given.
absl::Status ParseMetaspace(const Json& node, const std::string& source, const std::string& field,
                            std::string* replacement, PreTokenizerStep::Prepend* prepend) {
  *replacement = "\u2581";
  if (Member(node, "replacement") != nullptr) {
    ASSIGN_OR_RETURN(*replacement, StringMember(node, "replacement", source, field));
  }
  if (const Json* scheme = Member(node, "prepend_scheme"); scheme != nullptr) {
    if (*scheme == "always") {
      *prepend = PreTokenizerStep::Prepend::kAlways;
    } else if (*scheme == "first") {
      *prepend = PreTokenizerStep::Prepend::kFirst;
    } else if (*scheme == "never") {
      *prepend = PreTokenizerStep::Prepend::kNever;
    } else {
      return FieldError(source, field + ".prepend_scheme", "is not \"always\", \"first\" or \"never\"");
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(bool add_prefix_space, BoolMember(node, "add_prefix_space", true, source, field));
  *prepend = add_prefix_space ? PreTokenizerStep::Prepend::kAlways : PreTokenizerStep::Prepend::kNever;
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Json& node, const std::string& source,
                               const std::string& field, std::vector<PreTokenizerStep>* steps) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(node, source, field));
  if (!steps->empty() && steps->back().kind == PreTokenizerStep::Kind::kByteLevel) {
    return FieldError(source, field,
                      "follows a ByteLevel pre-tokenizer; ByteLevel must be the last one");
  }
  if (type == "Sequence") {
    return ForEachInList(node, "pretokenizers", source, field, [&](const Json& item, const std::string& where) {
      return ParsePreTokenizer(item, source, where, steps);
    });
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    // Hugging Face's defaults for fields left out.
    ASSIGN_OR_RETURN(step.add_prefix_space,
                     BoolMember(node, "add_prefix_space", true, source, field));
    ASSIGN_OR_RETURN(bool use_regex, BoolMember(node, "use_regex", true, source, field));
    if (use_regex) {
      ASSIGN_OR_RETURN(step.regex, SplitRegex::Compile(kGpt2SplitRegex));
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    RETURN_IF_ERROR(ParseMetaspace(node, source, field, &step.replacement, &step.prepend));
    ASSIGN_OR_RETURN(bool split, BoolMember(node, "split", true, source, field));
    if (split) {
      ASSIGN_OR_RETURN(step.regex, SplitRegex::Compile(step.replacement, /*literal=*/true));
      step.behavior = SplitBehavior::kMergedWithNext;
    }
  } else if (type == "Split") {
    const Json* pattern = Member(node, "pattern");
    const Json* regex =
        pattern != nullptr && pattern->is_object() ? Member(*pattern, "Regex") : nullptr;
    const Json* literal =
        pattern != nullptr && pattern->is_object() ? Member(*pattern, "String") : nullptr;
    const Json* text = regex != nullptr ? regex : literal;
    if (text == nullptr || !text->is_string()) {
      return FieldError(source, field + ".pattern",
                        "is not {\"Regex\": string} or {\"String\": string}");
    }
    absl::StatusOr<std::unique_ptr<SplitRegex>> compiled =
        SplitRegex::Compile(text->get_ref<const std::string&>(), /*literal=*/regex == nullptr);
    if (!compiled.ok()) {
      return FieldError(source, absl::StrCat(field, ".pattern.", regex ? "Regex" : "String"),
                        compiled.status().message());
    }
    step.regex = *std::move(compiled);
    const Json* behavior = Member(node, "behavior");
    if (behavior == nullptr || !behavior->is_string()) {
      return FieldError(source, field + ".behavior", "is missing or not a string");
    }
    const std::string& b = behavior->get_ref<const std::string&>();
    if (b == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (b == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (b == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (b == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return FieldError(source, absl::StrCat(field, ".behavior \"", b, "\""), "is not supported");
    }
    ASSIGN_OR_RETURN(step.invert, BoolMember(node, "invert", false, source, field));
  } else {
    return Unsupported(source, field, type);
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<int> CountMember(const Json& node, const char* key, const std::string& source,
                                const std::string& field) {
  const Json* v = Member(node, key);
  if (v == nullptr) return 0;
  if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 64) {
    return FieldError(source, absl::StrCat(field, ".", key), "is not a count in [0, 64]");
  }
  return static_cast<int>(v->get<int64_t>());
}

absl::Status ParseDecoder(const Json& node, const std::string& source, const std::string& field,
                          DecoderSpec* decoder) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(node, source, field));
  if (type == "Sequence") {
    return ForEachInList(node, "decoders", source, field, [&](const Json& item, const std::string& where) {
      return ParseDecoder(item, source, where, decoder);
    });
  }
  if (type == "Fuse") {
    decoder->fused = true;
    return absl::OkStatus();
  }
  using Step = DecoderSpec::TokenStep;
  Step step;
  if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    ASSIGN_OR_RETURN(step.content, StringMember(node, "content", source, field));
    ASSIGN_OR_RETURN(step.start, CountMember(node, "start", source, field));
    ASSIGN_OR_RETURN(step.stop, CountMember(node, "stop", source, field));
    if (decoder->fused) {  // The whole text's ends.
      if (decoder->strip_start > 0 || decoder->strip_stop > 0) {
        return FieldError(source, field, "is a second Strip after Fuse (not supported)");
      }
      decoder->strip = std::move(step.content);
      decoder->strip_start = step.start;
      decoder->strip_stop = step.stop;
      return absl::OkStatus();
    }
    decoder->per_token.push_back(std::move(step));
    return absl::OkStatus();
  }
  // The rest work token by token.
  if (decoder->fused) {
    return FieldError(source, absl::StrCat(field, ".type \"", type, "\""),
                      "after a Fuse is not supported (only Strip may follow it)");
  }
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    ASSIGN_OR_RETURN(step.pattern, StringPattern(node, source, field));
    ASSIGN_OR_RETURN(step.content, StringMember(node, "content", source, field));
  } else if (type == "Metaspace") {
    // Its replacement becomes a space, and the text's first token loses
    // the one its pre-tokenizer put there (transformers' MetaspaceDecoder).
    step.kind = Step::Kind::kReplace;
    PreTokenizerStep::Prepend prepend;
    RETURN_IF_ERROR(ParseMetaspace(node, source, field, &step.pattern, &prepend));
    step.content = " ";
    if (prepend != PreTokenizerStep::Prepend::kNever) {
      decoder->strip = " ";
      decoder->strip_start = 1;
    }
  } else {
    return Unsupported(source, field, type);
  }
  decoder->per_token.push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> ParseVocab(const Json& node,
                                                                     const std::string& source,
                                                                     const std::string& field) {
  if (!node.is_object()) return FieldError(source, field, "is missing or not an object");
  absl::flat_hash_map<std::string, int32_t> vocab;
  vocab.reserve(node.size());
  for (auto it = node.begin(); it != node.end(); ++it) {
    ASSIGN_OR_RETURN(int32_t id,
                     IdValue(it.value(), source, absl::StrCat(field, "[\"", it.key(), "\"]")));
    vocab.emplace(it.key(), id);
  }
  return vocab;
}

// A model.merges entry: "left right" (older files) or ["left", "right"].
absl::StatusOr<std::pair<std::string, std::string>> ParseMerge(const Json& m,
                                                               const std::string& source,
                                                               size_t index) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < s.size()) {
      return std::make_pair(s.substr(0, space), s.substr(space + 1));
    }
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return FieldError(source, absl::StrCat("model.merges[", index, "] ", m.dump()),
                    "is neither \"left right\" nor [\"left\", \"right\"]");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const Json& root, const std::string& source) {
  if (!root.is_object()) return absl::InvalidArgumentError(source + ": not a JSON object");
  TokenizerSpec spec;

  const Json* model = Member(root, "model");
  if (model == nullptr || !model->is_object()) return FieldError(source, "model", "is missing");
  // Old files leave the type out; a vocab with merges is a BPE model.
  if (const Json* type = Member(*model, "type"); type != nullptr) {
    if (!type->is_string()) return FieldError(source, "model.type", "is not a string");
    if (*type != "BPE") return Unsupported(source, "model", type->get<std::string>());
  }
  const Json* vocab = Member(*model, "vocab");
  if (vocab == nullptr) return FieldError(source, "model.vocab", "is missing");
  ASSIGN_OR_RETURN(spec.vocab, ParseVocab(*vocab, source, "model.vocab"));
  if (const Json* merges = Member(*model, "merges"); merges != nullptr) {
    if (!merges->is_array()) return FieldError(source, "model.merges", "is not an array");
    spec.merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      ASSIGN_OR_RETURN(auto merge, ParseMerge((*merges)[i], source, i));
      spec.merges.push_back(std::move(merge));
    }
  }
  if (const Json* dropout = Member(*model, "dropout"); dropout != nullptr) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      return FieldError(source, "model.dropout",
                        "must be null or 0 (BPE dropout is not supported)");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* affix = Member(*model, key);
    if (affix != nullptr && !(affix->is_string() && affix->get_ref<const std::string&>().empty())) {
      return FieldError(source, absl::StrCat("model.", key),
                        "is not supported (only empty or null)");
    }
  }
  if (const Json* unk = Member(*model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return FieldError(source, "model.unk_token", "is not a string");
    auto it = spec.vocab.find(unk->get_ref<const std::string&>());
    if (it == spec.vocab.end()) return FieldError(source, "model.unk_token", "is not in the vocab");
    spec.model_options.unk_id = it->second;
  }
  ASSIGN_OR_RETURN(spec.model_options.fuse_unk,
                   BoolMember(*model, "fuse_unk", false, source, "model"));
  ASSIGN_OR_RETURN(spec.model_options.ignore_merges,
                   BoolMember(*model, "ignore_merges", false, source, "model"));
  ASSIGN_OR_RETURN(spec.byte_fallback, BoolMember(*model, "byte_fallback", false, source, "model"));

  if (const Json* added = Member(root, "added_tokens"); added != nullptr) {
    if (!added->is_array()) return FieldError(source, "added_tokens", "is not an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& a = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!a.is_object()) return FieldError(source, field, "is not an object");
      AddedTokenSpec s;
      const Json* id = Member(a, "id");
      if (id == nullptr) return FieldError(source, field + ".id", "is missing");
      ASSIGN_OR_RETURN(s.token.id, IdValue(*id, source, field + ".id"));
      const Json* content = Member(a, "content");
      if (content == nullptr || !content->is_string()) {
        return FieldError(source, field + ".content", "is missing or not a string");
      }
      s.token.content = content->get<std::string>();
      if (s.token.content.empty()) continue;  // Hugging Face ignores these too.
      ASSIGN_OR_RETURN(s.token.special, BoolMember(a, "special", false, source, field));
      ASSIGN_OR_RETURN(s.single_word, BoolMember(a, "single_word", false, source, field));
      ASSIGN_OR_RETURN(s.lstrip, BoolMember(a, "lstrip", false, source, field));
      ASSIGN_OR_RETURN(s.rstrip, BoolMember(a, "rstrip", false, source, field));
      ASSIGN_OR_RETURN(s.normalized, BoolMember(a, "normalized", true, source, field));
      spec.added.push_back(std::move(s));
    }
  }

  if (const Json* normalizer = Member(root, "normalizer"); normalizer != nullptr) {
    RETURN_IF_ERROR(ParseNormalizer(*normalizer, source, "normalizer", &spec.normalizer));
  }

  const Json* pre = Member(root, "pre_tokenizer");
  if (pre != nullptr) {
    RETURN_IF_ERROR(ParsePreTokenizer(*pre, source, "pre_tokenizer", &spec.pre_tokenizer));
  }
  // A ByteLevel pre-tokenizer makes the vocabulary byte-level; without one
  // it spells the text itself (SentencePiece-style: Llama-2, Gemma, Mistral).
  const bool byte_level = !spec.pre_tokenizer.empty() &&
                          spec.pre_tokenizer.back().kind == PreTokenizerStep::Kind::kByteLevel;
  spec.model_options.char_level = !byte_level;

  if (const Json* decoder = Member(root, "decoder"); decoder != nullptr) {
    RETURN_IF_ERROR(ParseDecoder(*decoder, source, "decoder", &spec.decoder));
  } else if (byte_level) {
    spec.decoder.per_token.push_back({});  // Byte-level, as the model is.
  } else {
    return FieldError(source, "decoder",
                      "is missing (only a byte-level tokenizer may leave it out: its decoder is implied)");
  }

  const auto& merges = spec.merges;
  auto describe = [&](size_t i) {
    return absl::StrCat(source, ": model.merges[", i, "] \"", merges[i].first, " ",
                        merges[i].second, "\"");
  };
  return BpeTokenizer::Create(std::move(spec), describe, source);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::move(ss).str();
}

}  // namespace

// ---------------------------------------------------------------------------
// Public entry points.

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(std::string_view json_text,
                                                                        const std::string& source) {
  ASSIGN_OR_RETURN(Json root, ParseJson(json_text, source));
  return FromJson(root, source);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGpt2Files(
    const std::string& vocab_path, const std::string& merges_path) {
  ASSIGN_OR_RETURN(std::string vocab_text, ReadFile(vocab_path));
  ASSIGN_OR_RETURN(std::string merges_text, ReadFile(merges_path));
  ASSIGN_OR_RETURN(Json vocab_json, ParseJson(vocab_text, vocab_path));
  TokenizerSpec spec;
  if (!vocab_json.is_object()) {
    return absl::InvalidArgumentError(vocab_path + ": not a JSON object of token -> id");
  }
  ASSIGN_OR_RETURN(spec.vocab, ParseVocab(vocab_json, vocab_path, "entry"));

  // "#version: 0.2" first, then one "left right" per line; blank lines
  // (the trailing newline) are skipped.
  std::vector<size_t> line_of_merge;
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges_text.size();) {
    size_t eol = merges_text.find('\n', pos);
    if (eol == std::string::npos) eol = merges_text.size();
    std::string_view line(merges_text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(merges_path, ":", line_no, ": \"",
                                                     AbslView(line), "\" is not \"left right\""));
    }
    spec.merges.emplace_back(std::string(line.substr(0, space)),
                             std::string(line.substr(space + 1)));
    line_of_merge.push_back(line_no);
  }

  // GPT-2: its regex, byte-level, no prefix space; <|endoftext|> is special.
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  ASSIGN_OR_RETURN(byte_level.regex, SplitRegex::Compile(kGpt2SplitRegex));
  spec.pre_tokenizer.push_back(std::move(byte_level));
  spec.decoder.per_token.push_back({});  // ByteLevel.
  if (auto it = spec.vocab.find("<|endoftext|>"); it != spec.vocab.end()) {
    AddedTokenSpec eot;
    eot.token = {it->second, "<|endoftext|>", /*special=*/true};
    eot.normalized = false;
    spec.added.push_back(std::move(eot));
  }
  const auto& merges = spec.merges;
  auto describe = [&](size_t i) {
    return absl::StrCat(merges_path, ":", line_of_merge[i], ": merge \"", merges[i].first, " ",
                        merges[i].second, "\"");
  };
  return BpeTokenizer::Create(std::move(spec), describe, vocab_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    auto has = [&](const char* name) { return fs::is_regular_file(p / name, ec); };
    if (has("tokenizer.json")) return Load((p / "tokenizer.json").string());
    if (has("vocab.json") && has("merges.txt")) {
      return FromGpt2Files((p / "vocab.json").string(), (p / "merges.txt").string());
    }
    if (has("encoder.json") && has("vocab.bpe")) {
      return FromGpt2Files((p / "encoder.json").string(), (p / "vocab.bpe").string());
    }
    return absl::NotFoundError(absl::StrCat(
        path, ": no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe"));
  }
  if (!fs::exists(p, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return FromTokenizerJson(text, path);
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special) const {
  ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special));
  return SanitizeUtf8(bytes);
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  ASSIGN_OR_RETURN(std::string_view bytes, tokenizer_->TokenBytes(id, skip_special_));
  pending_ += bytes;
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDetokenizer::Finish() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

std::string SanitizeUtf8(std::string_view bytes) {
  if (FirstInvalidUtf8(bytes) == std::string_view::npos) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (size_t i = 0; i < bytes.size();) {
    size_t len;
    if (NextSequence(bytes, i, &len) == SeqKind::kValid) {
      out.append(bytes.substr(i, len));
    } else {
      out.append(kReplacementChar);
    }
    i += len;
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // A truncated character is at most 3 bytes, so its lead byte is among the
  // last 3. Any non-continuation byte starts a unit of the left-to-right
  // decoding, so the decoding can resume there.
  const size_t n = bytes.size();
  const size_t lowest = n >= 3 ? n - 3 : 0;
  for (size_t start = n; start-- > lowest;) {
    if ((static_cast<unsigned char>(bytes[start]) & 0xC0) == 0x80) continue;
    for (size_t i = start; i < n;) {
      size_t len;
      if (NextSequence(bytes, i, &len) == SeqKind::kTruncated) return i;
      i += len;
    }
    break;
  }
  return n;
}

bool IsValidUtf8(std::string_view bytes) {
  return FirstInvalidUtf8(bytes) == std::string_view::npos;
}

}  // namespace duet::text

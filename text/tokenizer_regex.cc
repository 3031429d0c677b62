#include "text/tokenizer_regex.h"

#include <algorithm>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "text/bpe_byte_level.h"

namespace duet::text {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

// One match-data block per thread, shared by every regex: ForEachMatch reads
// the offsets before calling out, so a nested ForEachMatch may reuse it.
pcre2_match_data* ThreadMatchData() {
  struct Holder {
    // One pair: only the whole match is read. A pattern with groups then
    // matches with rc == 0, which still sets the whole-match offsets.
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

}  // namespace

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(std::string_view pattern,
                                                                bool literal) {
  // PCRE2_LITERAL accepts PCRE2_UTF but not PCRE2_UCP (nothing to classify).
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto impl = std::make_unique<Impl>();
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &error, &error_offset, nullptr);
  if (impl->code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex: ", Pcre2Message(error), " at offset ", error_offset));
  }
  // Without JIT (unsupported platform, or no executable memory) the
  // interpreter gives the same matches, only slower.
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<SplitRegex>(new SplitRegex(std::move(impl)));
}

absl::Status SplitRegex::ForEachMatch(std::string_view subject,
                                      absl::FunctionRef<void(size_t, size_t)> on_match) const {
  // PCRE2 10.42 rejects a null subject even when it is empty.
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.empty() ? "" : subject.data());
  const size_t n = subject.size();
  pcre2_match_data* match = ThreadMatchData();
  size_t search_from = 0;
  size_t last_match_end = std::string_view::npos;
  while (search_from <= n) {
    int rc;
    if (impl_->jit) {
      rc = pcre2_jit_match(impl_->code, data, n, search_from, 0, match, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // The interpreter keeps its backtracking frames on the heap.
        rc = pcre2_match(impl_->code, data, n, search_from, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK,
                         match, nullptr);
      }
    } else {
      rc = pcre2_match(impl_->code, data, n, search_from, PCRE2_NO_UTF_CHECK, match, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return absl::ResourceExhaustedError(absl::StrCat("regex: ", Pcre2Message(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0];
    const size_t end = ovector[1] < begin ? begin : ovector[1];  // \K can invert them.
    if (begin == end) {
      search_from = end < n ? end + Utf8Length(static_cast<unsigned char>(subject[end])) : n + 1;
      if (end == last_match_end) continue;
    } else {
      search_from = end;
    }
    last_match_end = end;
    on_match(begin, end);
  }
  return absl::OkStatus();
}

absl::Status SplitPieces(const SplitRegex& re, std::string_view text, SplitBehavior behavior,
                         bool invert, absl::FunctionRef<void(std::string_view)> on_piece) {
  auto emit = [&](size_t begin, size_t end) {
    if (begin < end) on_piece(text.substr(begin, end - begin));
  };
  if (behavior == SplitBehavior::kIsolated || behavior == SplitBehavior::kRemoved) {
    auto maybe_emit = [&](size_t begin, size_t end, bool is_match) {
      if (behavior == SplitBehavior::kRemoved && is_match != invert) return;
      emit(begin, end);
    };
    size_t previous = 0;
    absl::Status status = re.ForEachMatch(text, [&](size_t begin, size_t end) {
      maybe_emit(previous, begin, /*is_match=*/false);
      maybe_emit(begin, end, /*is_match=*/true);
      previous = end;
    });
    if (!status.ok()) return status;
    maybe_emit(previous, text.size(), /*is_match=*/false);
    return absl::OkStatus();
  }
  // The merging behaviors look at neighbours: gather the cover first, as
  // Hugging Face's find_matches does (matches and the non-empty gaps).
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t previous = 0;
  absl::Status status = re.ForEachMatch(text, [&](size_t begin, size_t end) {
    if (previous < begin) parts.push_back({previous, begin, invert});
    if (begin < end) parts.push_back({begin, end, !invert});
    previous = end;
  });
  if (!status.ok()) return status;
  if (previous < text.size()) parts.push_back({previous, text.size(), invert});
  std::vector<Part> pieces;
  bool previous_match = false;
  if (behavior == SplitBehavior::kMergedWithNext) {
    for (size_t k = parts.size(); k-- > 0;) {
      const Part& p = parts[k];
      if (p.is_match && !previous_match && !pieces.empty()) {
        pieces.back().begin = p.begin;
      } else {
        pieces.push_back(p);
      }
      previous_match = p.is_match;
    }
    std::reverse(pieces.begin(), pieces.end());
  } else {
    for (const Part& p : parts) {
      const bool merge = behavior == SplitBehavior::kMergedWithPrevious ? p.is_match && !previous_match
                                                                         : p.is_match == previous_match;
      if (merge && !pieces.empty()) {
        pieces.back().end = p.end;
      } else {
        pieces.push_back(p);
      }
      previous_match = p.is_match;
    }
  }
  for (const Part& p : pieces) emit(p.begin, p.end);
  return absl::OkStatus();
}

}  // namespace duet::text

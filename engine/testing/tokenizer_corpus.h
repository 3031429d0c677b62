// A deterministic corpus of varied UTF-8 text (>= 1 MiB by default) for the
// tokenizer parity tests and the tokenizer benchmark: English prose with
// contractions in every case, C++/Python/JSON code, accented Latin, Cyrillic,
// CJK, Arabic, Hebrew, Devanagari, emoji (ZWJ sequences, skin tones, flags,
// keycaps), digit runs and whitespace runs of every kind.
//
//   std::vector<std::string> records = TokenizerCorpus();
//   RETURN_IF_ERROR(WriteCorpusJsonLines(records, dir + "/corpus.jsonl"));
//
// A record is what a tokenizer is asked to encode in one call. Most are one
// line with its line break ("\n", "\r\n", or none); code, paragraphs and
// whitespace records span several lines and hold blank lines, because the
// pre-tokenizer regexes treat runs of line breaks specially. The same seed
// gives the same records on every machine (no std:: distributions, whose
// results differ between standard libraries).
#ifndef DUET_ENGINE_TESTING_TOKENIZER_CORPUS_H_
#define DUET_ENGINE_TESTING_TOKENIZER_CORPUS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace duet::testing {

inline constexpr uint64_t kTokenizerCorpusSeed = 20250917;
inline constexpr size_t kTokenizerCorpusMinBytes = size_t{1} << 20;

// Records whose sizes add up to at least `min_bytes`. Every record is valid
// UTF-8 and non-empty.
std::vector<std::string> TokenizerCorpus(uint64_t seed = kTokenizerCorpusSeed,
                                         size_t min_bytes = kTokenizerCorpusMinBytes);

// One JSON string per line (the node scripts in engine/testing/npm read this form, so
// that records keep their line breaks).
absl::Status WriteCorpusJsonLines(const std::vector<std::string>& records, const std::string& path);

// The records back to back: the corpus as one plain text file.
absl::Status WriteCorpusText(const std::vector<std::string>& records, const std::string& path);

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_TOKENIZER_CORPUS_H_

// Byte-level BPE (GPT-2 style) trainer and Hugging Face tokenizer files.
//
// `duet make-model` builds model directories with random weights but a real
// tokenizer: merges learned here, deterministically, from a small built-in
// English corpus (TrainingCorpus()), then written as tokenizer.json and
// tokenizer_config.json that Hugging Face `tokenizers` and duet both load.
// Meant for test and benchmark models, not for training production vocabs.
//
//   ASSIGN_OR_RETURN(BpeVocab vocab, TrainByteLevelBpe(TrainingCorpus(), {4096, SpecialTokensFor(ChatFormat::kLlama3)}));
//   RETURN_IF_ERROR(WriteTokenizerFiles(dir, vocab, ChatFormat::kLlama3));
//
// Ids: 0..255 are the single bytes BY BYTE VALUE (id b is byte b, not GPT-2's
// printable-first order), then one id per learned merge result in merge
// order, then the special tokens. All functions are pure and thread-safe.
#ifndef DUET_ENGINE_BPE_TRAINER_H_
#define DUET_ENGINE_BPE_TRAINER_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
// ByteToUnicode, ByteLevelEncode/Decode and kGpt2SplitRegex, re-exported.
#include "text/bpe_byte_level.h"
#include "text/chat_templates.h"

namespace duet::text {

struct BpeTrainerOptions {
  // Total ids: 256 byte tokens + learned merges + special tokens.
  int vocab_size = 0;
  std::vector<std::string> special_tokens;
};

struct BpeVocab {
  // id -> token in byte-level form (GPT-2 byte-to-unicode, space = "Ġ").
  std::vector<std::string> tokens;
  // Merges in rank order, each part in byte-level form.
  std::vector<std::pair<std::string, std::string>> merges;
  // Special token i has id tokens.size() + i.
  std::vector<std::string> special_tokens;
};

// Splits `text` into words as kGpt2SplitRegex does, with ASCII character
// classes; every byte >= 0x80 counts as a letter. The pieces cover `text`.
std::vector<std::string_view> SplitGpt2Words(std::string_view text);

// Learns merges greedily: each step merges the most frequent adjacent pair
// within words; ties go to the pair whose (left, right) raw bytes compare
// smallest. Stops when 256 + distinct merge results + specials reaches
// vocab_size, or when no pair occurs twice (the vocab is then smaller).
// Two merges that spell the same token share its id, as in HF tokenizers.
// InvalidArgument if vocab_size < 256 + specials, or a special token is
// empty, repeated, or equal to a learned token.
absl::StatusOr<BpeVocab> TrainByteLevelBpe(std::string_view corpus,
                                           const BpeTrainerOptions& options);

// Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json
// into `dir` (created if missing). `vocab` must hold the special tokens of
// SpecialTokensFor(format). Errors name the file that failed.
absl::Status WriteTokenizerFiles(const std::string& dir, const BpeVocab& vocab,
                                 ChatFormat format);

// ~26 KB of original English prose about serving language models, with some
// code-like lines, numbers and accented words; the default training corpus.
std::string_view TrainingCorpus();

}  // namespace duet::text

#endif  // DUET_ENGINE_BPE_TRAINER_H_

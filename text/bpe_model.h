// The merge step of BPE: one pre-token in, token ids out, merging adjacent
// pairs by rank exactly as Hugging Face's BPE model does (lowest rank first,
// leftmost on ties). Byte-level vocabularies (GPT-2, Llama-3, Qwen) start
// from the word's bytes; character-level ones (SentencePiece-style: Llama-2,
// Gemma, Mistral) from its UTF-8 characters, with byte fallback.
//
// Internal to text:tokenizer, which builds one per loaded vocabulary and
// feeds it every pre-token; exposed in its own header so tests can pin the
// merge order and compare the two merge algorithms.
//
//   ASSIGN_OR_RETURN(auto model, BpeModel::Create(vocab, merges, {}, describe));
//   model->Encode("hello", &ids);
//
// Immutable after Create except for a bounded per-word cache; Encode is
// thread-safe.
#ifndef DUET_ENGINE_BPE_MODEL_H_
#define DUET_ENGINE_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace duet::text {

class BpeModel {
 public:
  struct Options {
    // A pre-token that is itself a token is emitted whole, without merging
    // (Llama-3's tokenizer.json sets this; merging could split it).
    bool ignore_merges = false;
    // Id for a byte that has no token; -1 drops the byte, as Hugging Face
    // does when the model has no unk_token.
    int32_t unk_id = -1;
    // Consecutive unknown bytes (characters) become one unk_id.
    bool fuse_unk = false;
    // Tokens are spelled as the text itself, and a word starts as its
    // characters: a character with no token becomes the "<0xXX>" tokens of
    // its bytes when `byte_fallback` (and all of them exist), else unk_id.
    bool char_level = false;
  };

  // `vocab` maps tokens to ids, in byte-level form (ByteLevelEncode) unless
  // char_level; `merges` are pairs in the same form, in rank order (rank =
  // index). In a byte-level vocabulary a single byte b's token is
  // ByteLevelEncode(b), or else Hugging Face's byte-fallback spelling
  // "<0xXX>" when `byte_fallback`. InvalidArgument when a merge
  // names a token, or spells a result, missing from `vocab`; the message
  // starts with describe_merge(index).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const absl::flat_hash_map<std::string, int32_t>& vocab,
      absl::Span<const std::pair<std::string, std::string>> merges, const Options& options,
      bool byte_fallback, absl::FunctionRef<std::string(size_t)> describe_merge);

  // Appends the ids of `word` (one pre-token: raw bytes, or valid UTF-8 when
  // char_level) to `ids`.
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;

  // The two merge algorithms, which give the same ids: a rescan of a small
  // array (fast for the short words most text is made of) and Hugging Face's
  // linked list with a priority queue (O(n log n) for long words).
  enum class Algorithm { kScan, kHeap };
  // Uncached; Encode picks the algorithm by length. Public for tests.
  void MergeWord(std::string_view word, Algorithm algorithm, std::vector<int32_t>* ids) const;

 private:
  struct MergeRule {
    int32_t rank;
    int32_t result;
  };
  // Bounded cache of merged words, sharded so threads rarely share a lock.
  class WordCache {
   public:
    bool Lookup(std::string_view word, std::vector<int32_t>* ids) const;
    void Insert(std::string_view word, absl::Span<const int32_t> word_ids);

   private:
    static constexpr int kShardBits = 4;
    static constexpr int kShards = 1 << kShardBits;
    // A full shard is cleared rather than evicted piecemeal: cheap, and text
    // that moves to a new vocabulary of words refills it quickly.
    static constexpr size_t kShardCapacity = 4096;
    struct Shard {
      mutable absl::Mutex mu;
      absl::flat_hash_map<std::string, absl::InlinedVector<int32_t, 4>> map ABSL_GUARDED_BY(mu);
    };
    static size_t ShardOf(std::string_view word);
    std::array<Shard, kShards> shards_;
  };

  BpeModel() = default;
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const MergeRule* FindMerge(int32_t left, int32_t right) const;
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  void MergeScan(std::vector<int32_t>* symbols) const;
  void MergeHeap(std::vector<int32_t>* symbols) const;

  // The UTF-8 bytes of one character, packed, as a key of char_ids_.
  static uint32_t CharKey(std::string_view c);

  Options options_;
  // -1: no token for the byte. When char_level, only the <0xXX> tokens.
  std::array<int32_t, 256> byte_ids_{};
  absl::flat_hash_map<uint32_t, int32_t> char_ids_;  // char_level: one-character tokens.
  absl::flat_hash_map<uint64_t, MergeRule> merges_;
  // Text -> id of every token, for ignore_merges; empty otherwise.
  absl::flat_hash_map<std::string, int32_t> whole_words_;
  mutable WordCache cache_;
};

}  // namespace duet::text

#endif  // DUET_ENGINE_BPE_MODEL_H_

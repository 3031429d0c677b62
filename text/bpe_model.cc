#include "text/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/bpe_byte_level.h"

namespace duet::text {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
// Up to this many symbols the rescan beats the heap's bookkeeping.
constexpr size_t kScanMaxSymbols = 64;
// Hugging Face caches words shorter than 256 bytes; longer ones are rare and
// would crowd the cache.
constexpr size_t kMaxCachedWordBytes = 256;

// Debian's abseil has its own string_view, which heterogeneous lookup needs.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const absl::flat_hash_map<std::string, int32_t>& vocab,
    absl::Span<const std::pair<std::string, std::string>> merges, const Options& options,
    bool byte_fallback, absl::FunctionRef<std::string(size_t)> describe_merge) {
  std::unique_ptr<BpeModel> model(new BpeModel);
  model->options_ = options;
  for (int b = 0; b < 256; ++b) {
    int32_t id = -1;
    if (auto it = options.char_level ? vocab.end()
                                     : vocab.find(ByteLevelEncode(std::string(1, static_cast<char>(b))));
        it != vocab.end()) {
      id = it->second;
    } else if (byte_fallback) {
      if (auto fb = vocab.find(absl::StrFormat("<0x%02X>", b)); fb != vocab.end()) id = fb->second;
    }
    model->byte_ids_[b] = id;
  }
  if (options.char_level) {
    for (const auto& [token, id] : vocab) {
      if (!token.empty() && Utf8Length(static_cast<unsigned char>(token[0])) == token.size()) {
        model->char_ids_.emplace(CharKey(token), id);
      }
    }
  }

  model->merges_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    auto l = vocab.find(left);
    if (l == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe_merge(i), ": token \"", left, "\" is not in the vocab"));
    }
    auto r = vocab.find(right);
    if (r == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe_merge(i), ": token \"", right, "\" is not in the vocab"));
    }
    joined.assign(left).append(right);
    auto result = vocab.find(joined);
    if (result == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe_merge(i), ": merged token \"", joined, "\" is not in the vocab"));
    }
    // A repeated pair takes its last rank, as Hugging Face's map does.
    model->merges_.insert_or_assign(PairKey(l->second, r->second),
                                    MergeRule{static_cast<int32_t>(i), result->second});
  }

  if (options.ignore_merges && options.char_level) {
    model->whole_words_ = vocab;
  } else if (options.ignore_merges) {
    model->whole_words_.reserve(vocab.size());
    for (const auto& [token, id] : vocab) {
      // Tokens outside the byte-level alphabet can never equal a pre-token.
      if (absl::StatusOr<std::string> raw = ByteLevelDecode(token); raw.ok()) {
        model->whole_words_.emplace(*std::move(raw), id);
      }
    }
  }
  return model;
}

const BpeModel::MergeRule* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

uint32_t BpeModel::CharKey(std::string_view c) {
  uint32_t key = 0;
  for (char b : c) key = (key << 8) | static_cast<unsigned char>(b);
  return key;
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  symbols->clear();
  if (options_.char_level) {
    // Hugging Face's merge_word: an unknown character's unk is held back
    // until the next known character (or the end), so that fuse_unk can
    // join runs; byte-fallback tokens do not release it.
    bool unk_pending = false;
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
      const std::string_view c = word.substr(i, len);
      i += len;
      if (auto it = char_ids_.find(CharKey(c)); it != char_ids_.end()) {
        if (unk_pending) symbols->push_back(options_.unk_id);
        unk_pending = false;
        symbols->push_back(it->second);
        continue;
      }
      if (std::all_of(c.begin(), c.end(), [&](char b) { return byte_ids_[static_cast<unsigned char>(b)] >= 0; })) {
        for (char b : c) symbols->push_back(byte_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
      if (options_.unk_id < 0) continue;
      if (unk_pending && !options_.fuse_unk) symbols->push_back(options_.unk_id);
      unk_pending = true;
    }
    if (unk_pending) symbols->push_back(options_.unk_id);
    return;
  }
  bool after_unk = false;
  for (char c : word) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      symbols->push_back(id);
      after_unk = false;
    } else if (options_.unk_id >= 0) {
      if (!(options_.fuse_unk && after_unk)) symbols->push_back(options_.unk_id);
      after_unk = true;
    }
  }
}

// Repeatedly merges the lowest-ranked adjacent pair (leftmost on ties). Ranks
// of the pairs are kept beside the symbols, so each merge costs two lookups
// and one scan.
void BpeModel::MergeScan(std::vector<int32_t>* symbols) const {
  int32_t* sym = symbols->data();
  size_t n = symbols->size();
  if (n < 2) return;
  int32_t rank[kScanMaxSymbols];
  int32_t result[kScanMaxSymbols];
  auto look = [&](size_t i) {
    const MergeRule* m = FindMerge(sym[i], sym[i + 1]);
    rank[i] = m == nullptr ? kNoRank : m->rank;
    result[i] = m == nullptr ? -1 : m->result;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNoRank) break;
    sym[best] = result[best];
    const size_t tail = n - best - 2;
    std::memmove(sym + best + 1, sym + best + 2, tail * sizeof(int32_t));
    std::memmove(rank + best, rank + best + 1, tail * sizeof(int32_t));
    std::memmove(result + best, result + best + 1, tail * sizeof(int32_t));
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  symbols->resize(n);
}

// Hugging Face's Word::merge_all: a doubly linked list of symbols and a
// min-heap of candidate merges by (rank, position). A popped candidate whose
// pair has changed since it was pushed is stale and skipped.
void BpeModel::MergeHeap(std::vector<int32_t>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> s(n);
  for (int i = 0; i < n; ++i) s[i] = {(*symbols)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue(
      std::greater<Candidate>(), std::move(storage));
  for (int i = 0; i + 1 < n; ++i) {
    if (const MergeRule* m = FindMerge(s[i].id, s[i + 1].id)) queue.push({m->rank, i, m->result});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = s[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int right = cur.next;
    const MergeRule* now = FindMerge(cur.id, s[right].id);
    if (now == nullptr || now->result != top.result) continue;
    cur.id = top.result;
    cur.next = s[right].next;
    s[right].alive = false;
    if (cur.next >= 0) s[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeRule* m = FindMerge(s[cur.prev].id, cur.id)) {
        queue.push({m->rank, cur.prev, m->result});
      }
    }
    if (cur.next >= 0) {
      if (const MergeRule* m = FindMerge(cur.id, s[cur.next].id)) {
        queue.push({m->rank, top.pos, m->result});
      }
    }
  }
  symbols->clear();
  for (const Symbol& sym : s) {
    if (sym.alive) symbols->push_back(sym.id);
  }
}

void BpeModel::MergeWord(std::string_view word, Algorithm algorithm,
                         std::vector<int32_t>* ids) const {
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  InitialSymbols(word, &symbols);
  if (algorithm == Algorithm::kScan && symbols.size() <= kScanMaxSymbols) {
    MergeScan(&symbols);
  } else {
    MergeHeap(&symbols);
  }
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto it = whole_words_.find(AbslView(word)); it != whole_words_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1 && !options_.char_level) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      ids->push_back(id);
    } else if (options_.unk_id >= 0) {
      ids->push_back(options_.unk_id);
    }
    return;
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable && cache_.Lookup(word, ids)) return;
  const size_t start = ids->size();
  MergeWord(word, word.size() <= kScanMaxSymbols ? Algorithm::kScan : Algorithm::kHeap, ids);
  if (cacheable) {
    cache_.Insert(word, absl::MakeConstSpan(ids->data() + start, ids->size() - start));
  }
}

size_t BpeModel::WordCache::ShardOf(std::string_view word) {
  // The high bits: the table inside the shard uses the low ones.
  return absl::Hash<absl::string_view>{}(AbslView(word)) >> (sizeof(size_t) * 8 - kShardBits);
}

bool BpeModel::WordCache::Lookup(std::string_view word, std::vector<int32_t>* ids) const {
  const Shard& shard = shards_[ShardOf(word)];
  absl::ReaderMutexLock lock(&shard.mu);
  auto it = shard.map.find(AbslView(word));
  if (it == shard.map.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeModel::WordCache::Insert(std::string_view word, absl::Span<const int32_t> word_ids) {
  Shard& shard = shards_[ShardOf(word)];
  absl::MutexLock lock(&shard.mu);
  if (shard.map.size() >= kShardCapacity) shard.map.clear();
  shard.map.try_emplace(AbslView(word), word_ids.begin(), word_ids.end());
}

}  // namespace duet::text

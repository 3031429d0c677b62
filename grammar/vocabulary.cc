#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace duet::grammar {
namespace {

TokenTrie BuildTrie(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids_in) {
  std::vector<int32_t> order = ids_in;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes[a] < bytes[b] || (bytes[a] == bytes[b] && a < b); });
  TokenTrie t;
  std::vector<int32_t> path;  // node index per depth - 1
  std::string_view prev;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      t.skip[path.back()] = t.size();
      path.pop_back();
    }
  };
  std::vector<std::vector<int32_t>> tokens_at;
  for (int32_t id : order) {
    std::string_view s = bytes[id];
    size_t common = 0;
    while (common < s.size() && common < prev.size() && common < path.size() && s[common] == prev[common]) ++common;
    close_to(common);
    for (size_t k = common; k < s.size(); ++k) {
      path.push_back(t.size());
      t.byte.push_back(static_cast<uint8_t>(s[k]));
      t.depth.push_back(static_cast<uint16_t>(k + 1));
      t.skip.push_back(0);
      tokens_at.emplace_back();
    }
    tokens_at[path.back()].push_back(id);
    t.max_depth = std::max<int32_t>(t.max_depth, static_cast<int32_t>(s.size()));
    prev = s;
  }
  close_to(0);
  t.tok_begin.push_back(0);
  for (const auto& v : tokens_at) {
    t.ids.insert(t.ids.end(), v.begin(), v.end());
    t.tok_begin.push_back(static_cast<int32_t>(t.ids.size()));
  }
  return t;
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& special,
                       std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos_ids)) {
  std::vector<int32_t> all, plain, exits;
  for (int32_t id = 0; id < size(); ++id) {
    if (id < static_cast<int32_t>(special.size()) && special[id] && !bytes_[id].empty()) {
      special_text_[id] = std::move(bytes_[id]);  // for text(), never for a grammar
      bytes_[id].clear();
    }
    const std::string& s = bytes_[id];
    if (s.empty()) continue;
    all.push_back(id);
    size_t first = 0;
    while (first < s.size() && IsPlainStringByte(static_cast<uint8_t>(s[first]))) ++first;
    if (first == s.size()) {
      plain.push_back(id);
      int32_t chars = 0;
      for (char c : s) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
      max_plain_chars_ = std::max(max_plain_chars_, chars);
    } else if (s[first] == '"' || s[first] == '\\') {
      exits.push_back(id);
    }
  }
  all_ = BuildTrie(bytes_, all);
  plain_ = BuildTrie(bytes_, plain);
  exits_ = BuildTrie(bytes_, exits);
}

absl::StatusOr<std::shared_ptr<const Vocabulary>> Vocabulary::FromTokenizer(const text::Tokenizer& tokenizer,
                                                                             std::vector<int32_t> eos_ids) {
  const int64_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> special(n, false);
  for (const text::AddedToken& t : tokenizer.added_tokens()) {
    if (t.special && t.id >= 0 && t.id < n) special[t.id] = true;
  }
  for (int32_t id = 0; id < n; ++id) {
    auto b = tokenizer.TokenBytes(id);
    if (b.ok()) bytes[id] = std::string(*b);  // holes in the id space stay empty: never allowed
  }
  std::vector<int32_t> eos;
  for (int32_t id : eos_ids) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("end-of-sequence id ", id, " is negative"));
    if (id < n) eos.push_back(id);  // past the tokenizer: no text, never in a mask
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), special, std::move(eos));
}

std::string_view Vocabulary::text(int32_t id) const {
  if (id < 0 || id >= size()) return {};
  if (!bytes_[id].empty()) return bytes_[id];
  auto it = special_text_.find(id);
  return it == special_text_.end() ? std::string_view() : std::string_view(it->second);
}

const uint64_t* Vocabulary::FreePlainMask(int32_t pending, int64_t room) const {
  if (room < 0 || room > max_plain_chars_) room = max_plain_chars_;
  const int64_t key = room * kUtf8States + pending;
  absl::MutexLock lock(&mu_);
  auto& slot = free_masks_[key];
  if (slot == nullptr) {
    slot = std::make_unique<std::vector<uint64_t>>(mask_words(), 0);
    struct S {
      int32_t pending;
      int32_t room;
    };
    WalkPlainTrie(
        plain_, S{pending, static_cast<int32_t>(room)},
        [](const S& s, uint8_t b, S* next) {
          bool starts;
          const int32_t p = Utf8Step(s.pending, b, &starts);
          if (p < 0 || (starts && s.room == 0)) return false;
          *next = S{p, s.room - (starts ? 1 : 0)};
          return true;
        },
        slot->data());
  }
  return slot->data();
}

}  // namespace duet::grammar

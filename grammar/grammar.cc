#include "grammar/grammar.h"

namespace duet::grammar {

void Grammar::AddLiteral(int32_t root, std::string_view text) {
  int32_t cur = root;
  for (char ch : text) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t next = LiteralChild(cur, b);
    if (next < 0) {
      next = static_cast<int32_t>(literals.size());
      literals.emplace_back();
      literals[cur].children.push_back({b, next});
    }
    cur = next;
  }
  literals[cur].terminal = true;
}

const uint64_t* Grammar::PlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int64_t room) const {
  const Vocabulary& v = *vocab_;
  if (dfa < 0) return v.FreePlainMask(pending, room);
  if (room < 0 || room > v.max_plain_chars()) room = v.max_plain_chars();
  const uint64_t key = (static_cast<uint64_t>(dfa) << 40) | (static_cast<uint64_t>(dfa_state) << 16) |
                       (static_cast<uint64_t>(room) << 2) | static_cast<uint64_t>(pending);
  absl::MutexLock lock(&mu_);
  auto& slot = plain_masks_[key];
  if (slot == nullptr) {
    slot = std::make_unique<std::vector<uint64_t>>(v.mask_words(), 0);
    const ByteDfa& d = *dfas[dfa];
    struct S {
      int32_t state, pending, room;
    };
    WalkPlainTrie(
        v.plain(), S{dfa_state, pending, static_cast<int32_t>(room)},
        [&d](const S& s, uint8_t b, S* next) {
          bool starts;
          const int32_t p = Utf8Step(s.pending, b, &starts);
          if (p < 0 || (starts && s.room == 0)) return false;
          const int32_t t = d.Next(s.state, b);
          if (t == ByteDfa::kDead) return false;
          *next = S{t, p, s.room - (starts ? 1 : 0)};
          return true;
        },
        slot->data());
  }
  return slot->data();
}

}  // namespace duet::grammar

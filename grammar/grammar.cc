#include "grammar/grammar.h"

namespace duet::grammar {

void Grammar::ComputeNullable() {
  nullable.assign(nodes.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nullable[i]) continue;
      const Node& n = nodes[i];
      bool v = false;
      switch (n.kind) {
        case NodeKind::kLiteral: v = literals[n.literal].terminal; break;
        case NodeKind::kRaw: v = dfas[n.dfa]->Accepting(dfas[n.dfa]->start()); break;
        case NodeKind::kSeq:
          v = true;
          for (int32_t item : n.sequence) v = v && nullable[item];
          break;
        case NodeKind::kRepeat: v = n.min_items == 0 || nullable[n.repeat]; break;
        case NodeKind::kUnion:
        case NodeKind::kOneOf:
          for (int32_t a : n.alternatives) v = v || nullable[a];
          break;
        default: break;
      }
      if (v) {
        nullable[i] = 1;
        changed = true;
      }
    }
  }
}

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
  return CachedPlainMask(dfa, dfa_state, pending, -1, -1, -1, room);
}

const uint64_t* Grammar::RawMask(int32_t dfa, int32_t dfa_state) const {
  const Vocabulary& v = *vocab_;
  absl::MutexLock lock(&mu_);
  auto& slot = plain_masks_[std::make_tuple(dfa, dfa_state, -1, -2, -2, -2, int64_t{-2})];
  if (slot == nullptr) {
    slot = std::make_unique<std::vector<uint64_t>>(v.mask_words(), 0);
    const ByteDfa& d = *dfas[dfa];
    WalkPlainTrie(
        v.all(), dfa_state,
        [&d](const int32_t& s, uint8_t b, int32_t* next) {
          *next = d.Next(s, b);
          return *next != ByteDfa::kDead;
        },
        slot->data());
  }
  return slot->data();
}

const uint64_t* Grammar::KeyPlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int32_t lo, int32_t hi,
                                      int32_t others) const {
  return CachedPlainMask(dfa, dfa_state, pending, lo, hi, others, -1);
}

const uint64_t* Grammar::CachedPlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int32_t lo, int32_t hi,
                                         int32_t others, int64_t room) const {
  const Vocabulary& v = *vocab_;
  absl::MutexLock lock(&mu_);
  auto& slot = plain_masks_[std::make_tuple(dfa, dfa_state, pending, lo, hi, others, room)];
  if (slot == nullptr) {
    slot = std::make_unique<std::vector<uint64_t>>(v.mask_words(), 0);
    const ByteDfa& d = *dfas[dfa];
    const bool key = lo >= 0 || others >= 0;
    struct S {
      int32_t state, pending, room;
    };
    WalkPlainTrie(
        v.plain(), S{dfa_state, pending, static_cast<int32_t>(room)},
        [&](const S& s, uint8_t b, S* next) {
          bool starts;
          const int32_t p = Utf8Step(s.pending, b, &starts);
          if (p < 0 || (starts && s.room == 0)) return false;
          const int32_t t = d.Next(s.state, b);
          if (t == ByteDfa::kDead) return false;
          if (key && !d.CanReachTag(t, lo, hi) && (others < 0 || !d.CanReachTag(t, others, d.num_tags() - 1))) {
            return false;
          }
          *next = S{t, p, s.room - (starts ? 1 : 0)};
          return true;
        },
        slot->data());
  }
  return slot->data();
}

}  // namespace duet::grammar

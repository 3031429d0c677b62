// A request's position in a grammar: advances over the bytes of accepted
// tokens, rolls back the last n of them (speculative decoding), and fills
// the token mask for the next step. One per sequence; not thread-safe (the
// grammar it reads is shared and immutable).
//
// The state is a set of stacks (one per way the bytes so far parse: a union
// is followed down every alternative), each a chain of frames in a pool
// the matcher owns: advancing copies only the frames that change, so a
// rollback truncates the pool and a mask walk discards what it built. Calls
// allocate only when the pool or a buffer grows past its high-water mark, or
// the first time a string state's plain-token mask is computed (then cached
// in the grammar).
//
//   Matcher m(grammar);
//   std::vector<uint64_t> mask(vocab.mask_words());
//   m.FillMask(mask.data());                // bit id set: id may come next
//   m.AcceptToken(id);                      // false (and no change) if it may not
#ifndef DUET_GRAMMAR_MATCHER_H_
#define DUET_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace duet::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Advances over `bytes` when the grammar allows them; else returns false
  // and stays where it was. One call is one step for Rollback.
  bool AcceptBytes(std::string_view bytes);
  // An end-of-sequence id is accepted where the grammar may end (and ends it).
  bool AcceptToken(int32_t id);
  // Undoes the last `steps` accepted calls (at most steps()).
  void Rollback(int32_t steps);
  int32_t steps() const { return static_cast<int32_t>(steps_.size()) - 1; }
  // The bytes so far are a whole value of the grammar.
  bool CanEnd() const;
  // Nothing but the end may follow.
  bool Done() const;
  // Sets bit `id` of `mask` (vocab.mask_words() words) for each token that
  // may come next; the end-of-sequence ids where the grammar may end.
  void FillMask(uint64_t* mask);

  const Grammar& grammar() const { return *g_; }

 private:
  struct Frame {
    int32_t node;
    int32_t below;  // the frame under this one; kDone under the root value
    int32_t a, b, c, d;
    int64_t v;
  };
  struct Step {
    int32_t tops_begin, tops_end;
    size_t pool_size;
    bool ended;
  };
  static constexpr int32_t kDone = -1;   // the root value is complete
  static constexpr int32_t kStart = -2;  // nothing consumed yet

  int32_t Push(const Frame& f) {
    pool_.push_back(f);
    return static_cast<int32_t>(pool_.size()) - 1;
  }
  // Appends to `out` the stacks `top` becomes after `byte`.
  void Feed(int32_t top, uint8_t byte, std::vector<int32_t>& out);
  void FeedBelow(int32_t below, uint8_t byte, std::vector<int32_t>& out) {
    if (below >= 0) Feed(below, byte, out);
  }
  void StartValue(int32_t node, int32_t below, uint8_t byte, std::vector<int32_t>& out);
  // A sequence from item `from` (its frame records the next item), a
  // repetition after `count` rounds, each begun with `byte`.
  void StartSeq(int32_t node, const Node& n, int32_t below, int32_t from, uint8_t byte, std::vector<int32_t>& out);
  void StartRepeat(int32_t node, const Node& n, int32_t below, int32_t count, uint8_t byte, std::vector<int32_t>& out);
  void StepString(const Frame& f, const Node& n, uint8_t byte, std::vector<int32_t>& out);
  bool StringChar(Frame& f, const Node& n, uint32_t cp);
  bool StringByte(Frame& f, const Node& n, uint8_t byte);
  bool KeyAlive(const Frame& f, const Node& n) const;
  // Some code point in [lo, hi] may follow in the string of frame `f`.
  bool EscapeViable(const Frame& f, const Node& n, uint32_t lo, uint32_t hi);
  void CloseKey(const Frame& f, const Node& n, std::vector<int32_t>& out);
  void StepNumber(Frame f, const Node& n, uint8_t byte, std::vector<int32_t>& out);
  bool NumberComplete(const Frame& f, const Node& n) const;
  bool IntegerAlive(const Frame& f, const Node& n) const;
  // Takes a whitespace byte inside an object or array when the grammar
  // allows them (Frame::v counts the run); false for any other byte.
  bool Whitespace(const Frame& f, uint8_t byte, std::vector<int32_t>& out);
  void StepObject(const Frame& f, const Node& n, uint8_t byte, std::vector<int32_t>& out);
  void StepArray(const Frame& f, const Node& n, uint8_t byte, std::vector<int32_t>& out);
  // Advances stacks [begin, end) of `in` over byte into `out`, without duplicates.
  void Advance(const std::vector<int32_t>& in, size_t begin, size_t end, uint8_t byte, std::vector<int32_t>& out);
  // Stacks in out[first..) whose top is a oneOf marker (a value just
  // completed in one of its alternatives) pop it, unless another
  // alternative of the same oneOf completed the same value.
  void ResolveOneOf(std::vector<int32_t>& out, size_t first);
  bool SameStack(int32_t a, int32_t b) const;
  bool StackCanEnd(int32_t top) const;
  void Walk(const TokenTrie& trie, uint64_t* mask);

  std::shared_ptr<const Grammar> g_;
  std::vector<Frame> pool_;
  std::vector<int32_t> tops_;  // every step's stacks, back to back
  std::vector<Step> steps_;
  std::vector<int32_t> scratch_a_, scratch_b_;
  std::vector<int32_t> walk_tops_;
  std::vector<int32_t> markers_;
  std::vector<size_t> walk_end_, walk_pool_;
};

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_MATCHER_H_

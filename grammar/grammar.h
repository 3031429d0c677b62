// A compiled grammar: the JSON values a schema allows, as a graph of nodes
// the matcher walks byte by byte. Built by CompileJsonSchema (schema.h);
// immutable once built and shared by every request that uses the schema
// (the plain-token mask cache inside is guarded by a mutex).
//
// Nodes: a literal set (const, enum, true/false/null, as compact JSON bytes
// in a trie), a string (JSON-escaped; its decoded bytes run through a DFA
// for `pattern`/`format`; lengths in code points), a number (bounds and
// multipleOf checked where the number ends), an object (properties in the
// schema's order, then the additional ones), an array (a tuple prefix, then
// items), a union (anyOf, type lists: the matcher follows every
// alternative at once), a oneOf (the same, and a value that completes in
// two alternatives at once is refused) and an object's key (a DFA tagging property names,
// patternProperties and "any other key").
//
//   ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, CompileJsonSchemaText(schema_text, vocab));
//   Matcher m(g);
#ifndef DUET_GRAMMAR_GRAMMAR_H_
#define DUET_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grammar/regex.h"
#include "grammar/vocabulary.h"

namespace duet::grammar {

enum class NodeKind : uint8_t { kLiteral, kString, kNumber, kObject, kArray, kUnion, kOneOf, kKey, kRaw, kSeq, kRepeat };

struct Property {
  std::string name;
  int32_t node = -1;
  bool required = false;
};

struct Node {
  NodeKind kind = NodeKind::kUnion;
  // kLiteral: root of its trie in Grammar::literals.
  int32_t literal = -1;
  // kString, kKey: index into Grammar::dfas, -1 for any string. kRaw: the
  // DFA the output's bytes themselves (no JSON) run through, whole.
  int32_t dfa = -1;
  int64_t min_length = 0, max_length = -1;  // code points; -1 unbounded
  // kNumber.
  bool integer = false;
  bool has_minimum = false, has_maximum = false;
  bool exclusive_minimum = false, exclusive_maximum = false;
  double minimum = 0, maximum = 0, multiple_of = 0;  // multiple_of 0: none
  // kObject. next_required[i]: the first required property at index >= i
  // (props.size() when none); pattern_nodes[k] is tagged props.size() + k in
  // the key DFA, and "any other key" props.size() + pattern_nodes.size().
  std::vector<Property> props;
  std::vector<int32_t> next_required;
  std::vector<int32_t> pattern_nodes;
  int32_t additional = -1;  // node of other keys' values; -1: none allowed
  int32_t key = -1;         // this object's kKey node
  int64_t min_properties = 0, max_properties = -1;
  // kArray.
  std::vector<int32_t> prefix;
  int32_t items = -1;  // node of items past the prefix; -1: none allowed
  int64_t min_items = 0, max_items = -1;
  // kUnion, kOneOf (a value must match exactly one alternative).
  std::vector<int32_t> alternatives;
  // kSeq (GBNF): items in order. kRepeat: `repeat` min_items..max_items
  // times (max -1: unbounded).
  std::vector<int32_t> sequence;
  int32_t repeat = -1;
  // kKey: the object it names keys of; `open` when the key DFA matches
  // any string (additional properties allowed).
  int32_t object = -1;
  bool open = false;
};

struct LiteralNode {
  std::vector<std::pair<uint8_t, int32_t>> children;
  bool terminal = false;
};

class Grammar {
 public:
  Grammar(std::shared_ptr<const Vocabulary> vocab) : vocab_(std::move(vocab)) {}

  std::vector<Node> nodes;
  std::vector<LiteralNode> literals;
  std::vector<std::shared_ptr<const ByteDfa>> dfas;
  int32_t root = -1;
  bool has_one_of = false;
  int32_t max_whitespace = 0;
  std::vector<char> nullable;  // per node: matches the empty output (ComputeNullable)  // bytes of whitespace allowed in a row between tokens of objects and arrays

  const Vocabulary& vocab() const { return *vocab_; }
  const std::shared_ptr<const Vocabulary>& vocab_ptr() const { return vocab_; }

  int32_t LiteralChild(int32_t lit, uint8_t byte) const {
    for (const auto& [b, child] : literals[lit].children) {
      if (b == byte) return child;
    }
    return -1;
  }
  // Fills `nullable`; every compiler calls it last.
  void ComputeNullable();
  // Adds `text` to the literal trie rooted at `root`.
  void AddLiteral(int32_t root, std::string_view text);

  // The tokens made only of plain string bytes (see Vocabulary) that a
  // string in DFA `dfa` (-1: none) at `dfa_state`, in Utf8Step state
  // `pending` and with room for `room` more code points
  // (-1: unbounded) may take: computed once per distinct argument list.
  const uint64_t* PlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int64_t room) const;
  // The same for an object's key in key DFA `dfa`: a token may come when
  // the key can still end as a name tagged in [lo, hi] or as a pattern or
  // other key (tags from `others`; -1: none may).
  // The tokens a raw-regex output in `dfa_state` may take next (the whole
  // vocabulary walked with the DFA alone), once per state.
  const uint64_t* RawMask(int32_t dfa, int32_t dfa_state) const;
  const uint64_t* KeyPlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int32_t lo, int32_t hi,
                               int32_t others) const;

 private:
  const uint64_t* CachedPlainMask(int32_t dfa, int32_t dfa_state, int32_t pending, int32_t lo, int32_t hi,
                                  int32_t others, int64_t room) const;

  std::shared_ptr<const Vocabulary> vocab_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int64_t>,
                              std::unique_ptr<std::vector<uint64_t>>>
      plain_masks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_GRAMMAR_H_

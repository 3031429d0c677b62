// What a request's output must follow, as the serving path carries it, and
// the per-sequence state that turns it into token masks.
//
// A ConstraintRequest is plain data: the router fills it from the API's
// fields (response_format, structured_outputs, guided_*, strict tools),
// compiles it once to refuse what the engine cannot enforce, and sends it in
// the GenerationSpec (proto GrammarSpec mirrors it field for field); every
// worker that samples for the request compiles it again through its
// GrammarCache (once per distinct request text) and keeps a TokenConstraint
// per sequence.
//
//   ConstraintRequest r{.kind = ConstraintKind::kJsonSchema, .text = schema_json};
//   ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, cache.Get(r));
//   TokenConstraint c(g, r.triggers);
//   for (int32_t t : generated_so_far) c.Accept(t);     // after a hand-off or a resume
//   absl::Span<const uint64_t> mask = c.Mask();         // empty: free (before a trigger)
//   ... sample with mask ...; c.Accept(token);
#ifndef DUET_GRAMMAR_CONSTRAINT_H_
#define DUET_GRAMMAR_CONSTRAINT_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/schema.h"
#include "nlohmann/json.hpp"

namespace duet::grammar {

// The values match proto GrammarSpec.Kind.
enum class ConstraintKind {
  kNone = 0,
  kJsonSchema = 1,  // text: the schema's JSON ("{}" or {"type":"object"} for json_object)
  kRegex = 2,       // text: an ECMA-262 pattern the whole output matches
  kChoice = 3,      // choices: the output is exactly one of them
  kGrammar = 4,     // text: a GBNF grammar, or a Lark one (told apart by `::=`)
  kToolCalls = 5,   // text: ToolCallsText of the calls' shape
};

struct ConstraintRequest {
  ConstraintKind kind = ConstraintKind::kNone;
  std::string text;
  std::vector<std::string> choices;
  // JSON kinds: whitespace allowed around structural characters (at most
  // CompileOptions' default in a row); off: compact JSON.
  bool whitespace = false;
  // Lazy: the grammar starts once the output has held each of these, in
  // order (a thinking section's end, a tool call's opening); the output
  // before them, and the triggers themselves, are free. Empty: from the
  // first token.
  std::vector<std::string> triggers;
};

// The shape as the JSON text a ConstraintRequest carries.
std::string ToolCallsText(const ToolCallsShape& shape);

// Compiles `request` over `vocab`. Errors are InvalidArgument naming the
// kind's field and where in it: a schema's keyword and JSON path (see
// schema.h), a pattern's position, a grammar's line and column, a tool's
// index. kNone is refused (nothing to compile).
absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const ConstraintRequest& request,
                                                                 std::shared_ptr<const Vocabulary> vocab);

// Compiled grammars by request, shared by the requests that send the same
// text; the least recently used past `capacity` are dropped (requests still
// holding one keep it). Thread-safe. Errors are not cached.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity) : vocab_(std::move(vocab)), capacity_(capacity) {}
  absl::StatusOr<std::shared_ptr<const Grammar>> Get(const ConstraintRequest& request);
  size_t size() const;
  const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const Grammar>>> lru_ ABSL_GUARDED_BY(mu_);  // newest first
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> index_ ABSL_GUARDED_BY(mu_);
};

// A GrammarCache whose vocabulary is made on first use (a large
// tokenizer's takes a few hundred milliseconds, which a server that never
// sees a grammar need not spend). Thread-safe; a failed make is retried.
class LazyGrammarCache {
 public:
  using VocabularyMaker = std::function<absl::StatusOr<std::shared_ptr<const Vocabulary>>()>;
  LazyGrammarCache(VocabularyMaker make, size_t capacity) : make_(std::move(make)), capacity_(capacity) {}
  absl::StatusOr<GrammarCache*> Get();

 private:
  const VocabularyMaker make_;
  const size_t capacity_;
  absl::Mutex mu_;
  std::unique_ptr<GrammarCache> cache_ ABSL_GUARDED_BY(mu_);
};

// One sequence's place in its grammar, fed the sequence's tokens as they
// are sampled. Not thread-safe.
class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::vector<std::string> triggers);

  // Feeds the next generated token. False when the grammar refuses it
  // (only possible for text that came unmasked: bytes after a trigger in
  // the token that completed it, or tokens fed from elsewhere); the
  // constraint is then broken and stays so.
  bool Accept(int32_t token);
  // The mask for the next token (bit id of word id / 64; ids past it are
  // not allowed); empty while the grammar has not started.
  absl::Span<const uint64_t> Mask();
  bool started() const { return next_trigger_ == triggers_.size(); }
  // The grammar took an end-of-sequence token: nothing more may follow
  // (ignore_eos or min_tokens asked for more, which the grammar ends).
  bool ended() const { return ended_; }
  bool broken() const { return broken_; }

 private:
  Matcher matcher_;
  const std::vector<std::string> triggers_;
  size_t next_trigger_ = 0;
  std::string tail_;  // Output bytes that may still start the next trigger.
  bool broken_ = false;
  bool ended_ = false;
  std::vector<uint64_t> mask_;
};

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_CONSTRAINT_H_

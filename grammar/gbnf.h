// GBNF (llama.cpp's grammar format) to a grammar over the output's bytes:
// rules `name ::= ...` with alternatives `|`, sequences, "literals" (with
// \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes), [character classes] (as
// regex classes: ranges, ^ negation), `.`, (groups), rule references
// (recursion too), and the quantifiers * + ? {m} {m,} {m,n}; `#` comments.
// The start rule is `root`. Refused with the rule and position: an unknown
// rule, left recursion (a rule that reaches itself before any byte), and a
// repetition of something that may be empty.
//
//   ASSIGN_OR_RETURN(auto g, CompileGbnf(R"(root ::= "yes" | "no")", vocab));
//
// CompileLark reads the Lark dialect vLLM also takes (`name: ...`, the
// start rule `start`): `?`/`!` rule prefixes and `.N` priorities (no
// bearing on what matches), alternatives on continuation lines, "literals"
// and "a".."z" ranges, /regexes/ (ECMA syntax, no flags), [optional] and
// (groups), * + ? and ~ n / ~ n..m, `//` comments, and `%import common.NAME`
// or `%import common (A, B)` for Lark's common terminals (NUMBER, INT, WS,
// CNAME, ESCAPED_STRING, ...). The text is matched as the rules write it:
// `%ignore` (implicit whitespace between tokens) is refused, as are other
// directives, templates, case-insensitive literals and regex flags, each by
// line and column; left recursion, which Lark's LALR parser allows, is
// refused by rule as in GBNF.
#ifndef DUET_GRAMMAR_GBNF_H_
#define DUET_GRAMMAR_GBNF_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "grammar/grammar.h"

namespace duet::grammar {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(std::string_view text, std::shared_ptr<const Vocabulary> vocab);
absl::StatusOr<std::shared_ptr<const Grammar>> CompileLark(std::string_view text, std::shared_ptr<const Vocabulary> vocab);

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_GBNF_H_

// The Jinja engine's insides, shared by its lexer, parser and interpreter:
// tokens, expression and statement trees. Private to //text/jinja.
#ifndef DUET_ENGINE_JINJA_AST_H_
#define DUET_ENGINE_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace duet::text::jinja {

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string value;
  int line = 1;
};

// Splits a template into text and tag tokens as Hugging Face's environment
// does (trim_blocks and lstrip_blocks on, `-` and `+` whitespace control,
// one trailing newline dropped, comments removed).
absl::StatusOr<std::vector<Token>> Lex(absl::string_view source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args: items (a tuple when `negated`, as (a, b) makes one)
    kDict,      // args: key, value, key, value...
    kAttr,      // args[0].name
    kIndex,     // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], each of 1-3 may be null
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs); args[0] null inside a filter block
    kTest,      // args[0] is [not] name(args[1..])
    kUnary,     // name ("-", "+", "not") args[0]
    kBinary,    // args[0] name args[1]: arithmetic, ~, comparisons, in, not in, and, or
    kCondition  // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind;
  int line = 1;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;
struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition null for else)
    kFor,          // for targets in expr [if filter]: body [else: else_body]
    kSet,          // set targets = expr, or set targets[0].attr = expr
    kSetBlock,     // set targets[0] [| filters]: body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body (the callee's `caller`)
    kFilterBlock,  // filter filters: body
    kScope,        // generation: body in place
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 1;
  std::string text;  // kText; kMacro's name; kSet's attribute
  ExprPtr expr;      // kOutput, kFor's iterable, kSet's value, kCallBlock's call
  ExprPtr filter;    // kFor's `if`
  std::vector<std::string> targets;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro, kCallBlock (default may be null)
  std::vector<ExprPtr> filters;                         // kSetBlock, kFilterBlock
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf
  Body body, else_body;
};

// The statements of a lexed template; errors name the construct and its line.
absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace duet::text::jinja

#endif  // DUET_ENGINE_JINJA_AST_H_

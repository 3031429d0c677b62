#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "text/jinja/ast.h"

namespace duet::text::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  absl::StatusOr<Body> Run() {
    std::string ended_by;
    Body body = ParseBody({}, &ended_by, 0, "");
    if (!error_.ok()) return error_;
    return body;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool IsOp(absl::string_view op) const { return Cur().type == T::kOp && Cur().value == op; }
  bool IsName(absl::string_view n) const { return Cur().type == T::kName && Cur().value == n; }
  void Fail(int line, absl::string_view what) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
  }
  bool ok() const { return error_.ok(); }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case T::kVarEnd:
        return "'}}'";
      case T::kBlockEnd:
        return "'%}'";
      case T::kEnd:
        return "the end of the template";
      case T::kString:
        return absl::StrCat("string '", t.value, "'");
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }
  bool ExpectOp(absl::string_view op) {
    if (IsOp(op)) {
      ++i_;
      return true;
    }
    Fail(Cur().line, absl::StrCat("expected '", op, "', found ", Describe(Cur())));
    return false;
  }
  bool ExpectBlockEnd(absl::string_view what) {
    if (Cur().type == T::kBlockEnd) {
      ++i_;
      return true;
    }
    Fail(Cur().line, absl::StrCat("expected '%}' to end the ", what, " tag, found ", Describe(Cur())));
    return false;
  }
  std::string ExpectName(absl::string_view what) {
    if (Cur().type == T::kName) return t_[i_++].value;
    Fail(Cur().line, absl::StrCat("expected ", what, ", found ", Describe(Cur())));
    return "";
  }

  // Statements up to a {% NAME %} with NAME in `ends` (consumed, with the
  // rest of its tag left for the caller), or the end of the template.
  Body ParseBody(const std::vector<std::string>& ends, std::string* ended_by, int open_line,
                 absl::string_view opener) {
    Body body;
    while (ok()) {
      const Token& tok = Cur();
      if (tok.type == T::kEnd) {
        if (!ends.empty()) {
          Fail(open_line, absl::StrCat("'", opener, "' is never closed (expected {% ", absl::StrJoin(ends, " %} or {% "),
                                       " %})"));
        }
        return body;
      }
      if (tok.type == T::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = tok.line;
        n->text = tok.value;
        body.push_back(std::move(n));
        ++i_;
      } else if (tok.type == T::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tok.line;
        n->expr = ParseExpression();
        if (!ok()) return body;
        if (Cur().type != T::kVarEnd) {
          Fail(Cur().line, absl::StrCat("expected '}}', found ", Describe(Cur())));
          return body;
        }
        ++i_;
        body.push_back(std::move(n));
      } else if (tok.type == T::kBlockBegin) {
        ++i_;
        const Token& kw = Cur();
        if (kw.type != T::kName) {
          Fail(kw.line, absl::StrCat("expected a statement name after '{%', found ", Describe(kw)));
          return body;
        }
        for (const std::string& e : ends) {
          if (kw.value == e) {
            ++i_;
            *ended_by = e;
            return body;
          }
        }
        NodePtr n = ParseStatement();
        if (n != nullptr) body.push_back(std::move(n));
      } else {
        Fail(tok.line, absl::StrCat("unexpected ", Describe(tok)));
      }
    }
    return body;
  }

  NodePtr ParseStatement() {
    const Token& kw = Cur();
    const int line = kw.line;
    const std::string name = kw.value;
    ++i_;
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string ended_by;
    if (name == "if") {
      n->kind = Node::Kind::kIf;
      ExprPtr cond = ParseExpression();
      if (!ExpectBlockEnd("if")) return nullptr;
      for (;;) {
        Body b = ParseBody({"elif", "else", "endif"}, &ended_by, line, "if");
        if (!ok()) return nullptr;
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (ended_by == "endif") break;
        if (ended_by == "elif") {
          cond = ParseExpression();
          if (!ExpectBlockEnd("elif")) return nullptr;
        } else {
          if (!ExpectBlockEnd("else")) return nullptr;
          Body e = ParseBody({"endif"}, &ended_by, line, "if");
          if (!ok()) return nullptr;
          n->branches.emplace_back(nullptr, std::move(e));
          break;
        }
      }
      if (!ExpectBlockEnd("endif")) return nullptr;
    } else if (name == "for") {
      n->kind = Node::Kind::kFor;
      n->targets.push_back(ExpectName("a loop variable"));
      while (ok() && IsOp(",")) {
        ++i_;
        n->targets.push_back(ExpectName("a loop variable"));
      }
      if (ok() && !IsName("in")) Fail(Cur().line, absl::StrCat("expected 'in' in the for tag, found ", Describe(Cur())));
      ++i_;
      n->expr = ParseExpression(/*allow_condition=*/false);
      if (ok() && IsName("if")) {
        ++i_;
        n->filter = ParseExpression();
      }
      if (ok() && IsName("recursive")) {
        Fail(Cur().line, "recursive for loops are not supported");
        return nullptr;
      }
      if (!ExpectBlockEnd("for")) return nullptr;
      n->body = ParseBody({"else", "endfor"}, &ended_by, line, "for");
      if (!ok()) return nullptr;
      if (ended_by == "else") {
        if (!ExpectBlockEnd("else")) return nullptr;
        n->else_body = ParseBody({"endfor"}, &ended_by, line, "for");
      }
      if (!ExpectBlockEnd("endfor")) return nullptr;
    } else if (name == "set") {
      n->targets.push_back(ExpectName("a variable name to set"));
      if (ok() && IsOp(".")) {
        ++i_;
        n->text = ExpectName("an attribute name");
      }
      while (ok() && IsOp(",") && n->text.empty()) {
        ++i_;
        n->targets.push_back(ExpectName("a variable name to set"));
      }
      if (!ok()) return nullptr;
      if (IsOp("=")) {
        ++i_;
        n->kind = Node::Kind::kSet;
        n->expr = ParseTuple();
        if (!ExpectBlockEnd("set")) return nullptr;
      } else {
        if (n->targets.size() != 1 || !n->text.empty()) {
          Fail(line, "a block set ({% set x %}...{% endset %}) takes one plain name");
          return nullptr;
        }
        n->kind = Node::Kind::kSetBlock;
        while (ok() && IsOp("|")) {
          ++i_;
          n->filters.push_back(ParseFilter(nullptr));
        }
        if (!ExpectBlockEnd("set")) return nullptr;
        n->body = ParseBody({"endset"}, &ended_by, line, "set");
        if (!ExpectBlockEnd("endset")) return nullptr;
      }
    } else if (name == "macro") {
      n->kind = Node::Kind::kMacro;
      n->text = ExpectName("a macro name");
      ParseParams(&n->params);
      if (!ExpectBlockEnd("macro")) return nullptr;
      n->body = ParseBody({"endmacro"}, &ended_by, line, "macro");
      if (ok() && Cur().type == T::kName) ++i_;  // {% endmacro name %}
      if (!ExpectBlockEnd("endmacro")) return nullptr;
    } else if (name == "call") {
      n->kind = Node::Kind::kCallBlock;
      if (IsOp("(")) ParseParams(&n->params);
      n->expr = ParseExpression();
      if (ok() && (n->expr == nullptr || n->expr->kind != Expr::Kind::kCall)) {
        Fail(line, "a call block needs a macro call ({% call name(...) %})");
        return nullptr;
      }
      if (!ExpectBlockEnd("call")) return nullptr;
      n->body = ParseBody({"endcall"}, &ended_by, line, "call");
      if (!ExpectBlockEnd("endcall")) return nullptr;
    } else if (name == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      n->filters.push_back(ParseFilter(nullptr));
      while (ok() && IsOp("|")) {
        ++i_;
        n->filters.push_back(ParseFilter(nullptr));
      }
      if (!ExpectBlockEnd("filter")) return nullptr;
      n->body = ParseBody({"endfilter"}, &ended_by, line, "filter");
      if (!ExpectBlockEnd("endfilter")) return nullptr;
    } else if (name == "generation") {
      n->kind = Node::Kind::kScope;
      if (!ExpectBlockEnd("generation")) return nullptr;
      n->body = ParseBody({"endgeneration"}, &ended_by, line, "generation");
      if (!ExpectBlockEnd("endgeneration")) return nullptr;
    } else if (name == "break" || name == "continue") {
      n->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (!ExpectBlockEnd(name)) return nullptr;
    } else {
      Fail(line, absl::StrCat("unknown or unsupported statement '", name, "'"));
      return nullptr;
    }
    return ok() ? std::move(n) : nullptr;
  }

  // (name, name=default, ...)
  void ParseParams(std::vector<std::pair<std::string, ExprPtr>>* params) {
    if (!ExpectOp("(")) return;
    while (ok() && !IsOp(")")) {
      std::string p = ExpectName("a parameter name");
      ExprPtr def;
      if (ok() && IsOp("=")) {
        ++i_;
        def = ParseExpression();
      }
      params->emplace_back(std::move(p), std::move(def));
      if (ok() && !IsOp(")")) ExpectOp(",");
    }
    ExpectOp(")");
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr Binary(absl::string_view op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = Make(Expr::Kind::kBinary, line);
    e->name = std::string(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // An expression, or several separated by commas (a tuple, as a list).
  ExprPtr ParseTuple() {
    const int line = Cur().line;
    ExprPtr first = ParseExpression();
    if (!ok() || !IsOp(",")) return first;
    ExprPtr list = Make(Expr::Kind::kList, line);
    list->negated = true;
    list->args.push_back(std::move(first));
    while (ok() && IsOp(",")) {
      ++i_;
      list->args.push_back(ParseExpression());
    }
    return list;
  }

  ExprPtr ParseExpression(bool allow_condition = true) {
    const int line = Cur().line;
    ExprPtr e = ParseOr();
    while (ok() && allow_condition && IsName("if")) {
      ++i_;
      ExprPtr c = Make(Expr::Kind::kCondition, line);
      c->args.push_back(std::move(e));
      c->args.push_back(ParseOr());
      if (ok() && IsName("else")) {
        ++i_;
        c->args.push_back(ParseExpression());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }
  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (ok() && IsName("or")) {
      const int line = Cur().line;
      ++i_;
      e = Binary("or", std::move(e), ParseAnd(), line);
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (ok() && IsName("and")) {
      const int line = Cur().line;
      ++i_;
      e = Binary("and", std::move(e), ParseNot(), line);
    }
    return e;
  }
  ExprPtr ParseNot() {
    if (IsName("not")) {
      ExprPtr e = Make(Expr::Kind::kUnary, Cur().line);
      ++i_;
      e->name = "not";
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    while (ok()) {
      const int line = Cur().line;
      std::string op;
      if (Cur().type == T::kOp && (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
                                   Cur().value == ">" || Cur().value == "<=" || Cur().value == ">=")) {
        op = Cur().value;
        ++i_;
      } else if (IsName("in")) {
        op = "in";
        ++i_;
      } else if (IsName("not") && Peek().type == T::kName && Peek().value == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      e = Binary(op, std::move(e), ParseMath1(), line);
    }
    return e;
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (ok() && (IsOp("+") || IsOp("-"))) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      ++i_;
      e = Binary(op, std::move(e), ParseConcat(), line);
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (ok() && IsOp("~")) {
      const int line = Cur().line;
      ++i_;
      e = Binary("~", std::move(e), ParseMath2(), line);
    }
    return e;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (ok() && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      ++i_;
      e = Binary(op, std::move(e), ParsePow(), line);
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (ok() && IsOp("**")) {
      const int line = Cur().line;
      ++i_;
      e = Binary("**", std::move(e), ParseUnary(true), line);
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(Expr::Kind::kUnary, Cur().line);
      e->name = Cur().value;
      ++i_;
      e->args.push_back(ParseUnary(false));
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }
  ExprPtr ParsePrimary() {
    const Token& tok = Cur();
    const int line = tok.line;
    if (!ok()) return nullptr;
    switch (tok.type) {
      case T::kName: {
        ++i_;
        ExprPtr e;
        if (tok.value == "true" || tok.value == "True") {
          e = Make(Expr::Kind::kLiteral, line);
          e->value = Value::Bool(true);
        } else if (tok.value == "false" || tok.value == "False") {
          e = Make(Expr::Kind::kLiteral, line);
          e->value = Value::Bool(false);
        } else if (tok.value == "none" || tok.value == "None") {
          e = Make(Expr::Kind::kLiteral, line);
          e->value = Value::None();
        } else {
          e = Make(Expr::Kind::kName, line);
          e->name = tok.value;
        }
        return e;
      }
      case T::kString: {
        std::string s;
        while (Cur().type == T::kString) s += t_[i_++].value;  // adjacent literals join
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->value = Value::String(std::move(s));
        return e;
      }
      case T::kInt: {
        ++i_;
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        int64_t v = 0;
        if (!absl::SimpleAtoi(tok.value, &v)) Fail(line, absl::StrCat("integer ", tok.value, " is out of range"));
        e->value = Value::Int(v);
        return e;
      }
      case T::kFloat: {
        ++i_;
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->value = Value::Float(std::strtod(tok.value.c_str(), nullptr));
        return e;
      }
      case T::kOp:
        if (tok.value == "(") {
          ++i_;
          if (IsOp(")")) {
            ++i_;
            ExprPtr empty = Make(Expr::Kind::kList, line);
            empty->negated = true;
            return empty;
          }
          ExprPtr e = ParseExpression();
          if (ok() && IsOp(",")) {
            ExprPtr list = Make(Expr::Kind::kList, line);
            list->negated = true;  // a tuple
            list->args.push_back(std::move(e));
            while (ok() && IsOp(",")) {
              ++i_;
              if (IsOp(")")) break;
              list->args.push_back(ParseExpression());
            }
            e = std::move(list);
          }
          ExpectOp(")");
          return e;
        }
        if (tok.value == "[") {
          ++i_;
          ExprPtr e = Make(Expr::Kind::kList, line);
          while (ok() && !IsOp("]")) {
            e->args.push_back(ParseExpression());
            if (ok() && !IsOp("]")) ExpectOp(",");
          }
          ExpectOp("]");
          return e;
        }
        if (tok.value == "{") {
          ++i_;
          ExprPtr e = Make(Expr::Kind::kDict, line);
          while (ok() && !IsOp("}")) {
            e->args.push_back(ParseExpression());
            ExpectOp(":");
            e->args.push_back(ParseExpression());
            if (ok() && !IsOp("}")) ExpectOp(",");
          }
          ExpectOp("}");
          return e;
        }
        break;
      default:
        break;
    }
    Fail(line, absl::StrCat("expected an expression, found ", Describe(tok)));
    return nullptr;
  }
  ExprPtr ParsePostfix(ExprPtr e) {
    while (ok()) {
      const int line = Cur().line;
      if (IsOp(".")) {
        ++i_;
        ExprPtr a;
        if (Cur().type == T::kInt) {  // x.0: an index
          a = Make(Expr::Kind::kIndex, line);
          ExprPtr idx = Make(Expr::Kind::kLiteral, line);
          int64_t v = 0;
          (void)absl::SimpleAtoi(Cur().value, &v);
          idx->value = Value::Int(v);
          ++i_;
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          a = Make(Expr::Kind::kAttr, line);
          a->name = ExpectName("an attribute name after '.'");
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        ++i_;
        ExprPtr parts[3];
        int colons = 0;
        while (ok() && !IsOp("]")) {
          if (IsOp(":")) {
            if (++colons > 2) Fail(Cur().line, "a slice takes at most two ':'");
            ++i_;
            continue;
          }
          if (parts[colons] != nullptr) {
            Fail(Cur().line, absl::StrCat("expected ']' or ':', found ", Describe(Cur())));
            break;
          }
          parts[colons] = ParseExpression();
        }
        ExpectOp("]");
        if (colons == 0) {
          if (parts[0] == nullptr) Fail(line, "an empty subscript []");
          ExprPtr idx = Make(Expr::Kind::kIndex, line);
          idx->args.push_back(std::move(e));
          idx->args.push_back(std::move(parts[0]));
          e = std::move(idx);
        } else {
          ExprPtr sl = Make(Expr::Kind::kSlice, line);
          sl->args.push_back(std::move(e));
          for (auto& p : parts) sl->args.push_back(std::move(p));
          e = std::move(sl);
        }
      } else if (IsOp("(")) {
        ExprPtr c = Make(Expr::Kind::kCall, line);
        c->args.push_back(std::move(e));
        ParseCallArgs(c.get());
        e = std::move(c);
      } else {
        break;
      }
    }
    return e;
  }
  // (a, b, k=v) into e->args (after what is there) and e->kwargs.
  void ParseCallArgs(Expr* e) {
    if (!ExpectOp("(")) return;
    while (ok() && !IsOp(")")) {
      if (Cur().type == T::kName && Peek().type == T::kOp && Peek().value == "=") {
        std::string k = t_[i_].value;
        i_ += 2;
        e->kwargs.emplace_back(std::move(k), ParseExpression());
      } else {
        if (!e->kwargs.empty()) Fail(Cur().line, "a positional argument after a keyword argument");
        e->args.push_back(ParseExpression());
      }
      if (ok() && !IsOp(")")) ExpectOp(",");
    }
    ExpectOp(")");
  }
  ExprPtr ParseFilter(ExprPtr operand) {
    ExprPtr f = Make(Expr::Kind::kFilter, Cur().line);
    f->name = ExpectName("a filter name");
    f->args.push_back(std::move(operand));
    if (ok() && IsOp("(")) ParseCallArgs(f.get());
    return f;
  }
  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (ok()) {
      if (IsOp("|")) {
        ++i_;
        e = ParseFilter(std::move(e));
      } else if (IsName("is")) {
        ExprPtr t = Make(Expr::Kind::kTest, Cur().line);
        ++i_;
        if (IsName("not")) {
          t->negated = true;
          ++i_;
        }
        // Test names include keywords (none, true, false, in).
        if (Cur().type != T::kName) {
          Fail(Cur().line, absl::StrCat("expected a test name after 'is', found ", Describe(Cur())));
          return e;
        }
        t->name = t_[i_++].value;
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          ParseCallArgs(t.get());
        } else if (Cur().type == T::kString || Cur().type == T::kInt || Cur().type == T::kFloat ||
                   (Cur().type == T::kName && Cur().value != "and" && Cur().value != "or" && Cur().value != "if" &&
                    Cur().value != "else" && Cur().value != "is" && Cur().value != "in" && Cur().value != "not")) {
          t->args.push_back(ParsePostfix(ParsePrimary()));  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else {
        break;
      }
    }
    return e;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Run(); }

}  // namespace duet::text::jinja

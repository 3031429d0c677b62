#include "text/jinja/template.h"

#include <cmath>
#include <functional>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"

namespace duet::text::jinja {
namespace {

// A scope: the template's, a loop iteration's, a macro call's.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* Lookup(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { kNormal, kBreak, kContinue };

absl::Status AtLine(int line, const absl::Status& s) {
  if (s.ok() || absl::StartsWith(s.message(), "line ")) return s;
  return absl::Status(s.code(), absl::StrCat("line ", line, ": ", s.message()));
}
absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// Python's slice of a sequence of `n` items: the indices taken.
std::vector<size_t> SliceIndices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  const int64_t st = step.kind() == Value::Kind::kInt ? step.int_value() : 1;
  std::vector<size_t> out;
  if (st == 0) return out;
  auto clamp = [&](const Value& v, int64_t def, bool is_start) {
    if (v.kind() != Value::Kind::kInt) return def;
    int64_t i = v.int_value();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1, true);
  const int64_t e = clamp(stop, st > 0 ? n : -1, false);
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

class Interpreter {
 public:
  absl::Status Exec(const Body& body, const FramePtr& f, std::string* out, Flow* flow) {
    for (const NodePtr& n : body) {
      RETURN_IF_ERROR(ExecNode(*n, f, out, flow));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  absl::Status ExecNode(const Node& n, const FramePtr& f, std::string* out, Flow* flow) {
    switch (n.kind) {
      case Node::Kind::kText:
        *out += n.text;
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(auto v, Eval(*n.expr, f));
        *out += v.Str();
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = cond == nullptr;
          if (!take) {
            ASSIGN_OR_RETURN(auto c, Eval(*cond, f));
            take = c.Truthy();
          }
          if (take) return Exec(body, f, out, flow);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return ExecFor(n, f, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(auto v, Eval(*n.expr, f));
        return Assign(n, f, std::move(v));
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        RETURN_IF_ERROR(Exec(n.body, f, &captured, &inner));
        ASSIGN_OR_RETURN(auto v, ApplyFilters(n.filters, Value::String(captured), f));
        f->vars[n.targets[0]] = std::move(v);
        return absl::OkStatus();
      }
      case Node::Kind::kMacro:
        f->vars[n.text] = MakeMacro(n, f, n.text);
        return absl::OkStatus();
      case Node::Kind::kCallBlock: {
        const Expr& call = *n.expr;
        ASSIGN_OR_RETURN(auto callee, Eval(*call.args[0], f));
        if (!callee.is_function()) return LineError(n.line, "a call block must call a macro");
        Args args;
        RETURN_IF_ERROR(EvalArgs(call, 1, f, &args));
        args.keyword.emplace_back("caller", MakeMacro(n, f, "caller"));
        absl::StatusOr<Value> r = callee.Call(args);
        if (!r.ok()) return AtLine(n.line, r.status());
        *out += r->Str();
        return absl::OkStatus();
      }
      case Node::Kind::kFilterBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        RETURN_IF_ERROR(Exec(n.body, f, &captured, &inner));
        ASSIGN_OR_RETURN(auto v, ApplyFilters(n.filters, Value::String(captured), f));
        *out += v.Str();
        return absl::OkStatus();
      }
      case Node::Kind::kScope:
        return Exec(n.body, f, out, flow);
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) return LineError(n.line, "break or continue outside a for loop");
        *flow = n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Node& n, const FramePtr& f, Value v) {
    if (!n.text.empty()) {
      const Value* target = f->Lookup(n.targets[0]);
      if (target == nullptr || !target->is_namespace()) {
        return LineError(n.line, absl::StrCat("cannot set '", n.targets[0], ".", n.text, "': '", n.targets[0],
                                              "' is not a namespace()"));
      }
      // Namespaces are shared: the copy changes the original.
      Value ns = *target;
      ns.mutable_object().Set(n.text, std::move(v));
      return absl::OkStatus();
    }
    return Bind(n.targets, std::move(v), f.get(), n.line);
  }

  absl::Status Bind(const std::vector<std::string>& targets, Value v, Frame* f, int line) {
    if (targets.size() == 1) {
      f->vars[targets[0]] = std::move(v);
      return absl::OkStatus();
    }
    if (!v.is_list() || v.list().size() != targets.size()) {
      return LineError(line, absl::StrCat("cannot unpack ", v.TypeName(), " into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) f->vars[targets[i]] = v.list()[i];
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Node& n, const FramePtr& f, std::string* out) {
    ASSIGN_OR_RETURN(auto seq, Eval(*n.expr, f));
    absl::StatusOr<List> iterated = Iterate(seq);
    if (!iterated.ok()) return LineError(n.line, absl::StrCat("cannot loop over '", seq.TypeName(), "'"));
    List items = std::move(*iterated);
    if (n.filter != nullptr) {
      List kept;
      for (const Value& item : items) {
        auto scope = std::make_shared<Frame>();
        scope->parent = f;
        RETURN_IF_ERROR(Bind(n.targets, item, scope.get(), n.line));
        ASSIGN_OR_RETURN(auto c, Eval(*n.filter, scope));
        if (c.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Flow flow = Flow::kNormal;
      return Exec(n.else_body, f, out, &flow);
    }
    ++loop_depth_;
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      auto scope = std::make_shared<Frame>();
      scope->parent = f;
      RETURN_IF_ERROR(Bind(n.targets, items[static_cast<size_t>(i)], scope.get(), n.line));
      Value loop = Value::MakeObject();
      Object& o = loop.mutable_object();
      o.Set("index", Value::Int(i + 1));
      o.Set("index0", Value::Int(i));
      o.Set("revindex", Value::Int(len - i));
      o.Set("revindex0", Value::Int(len - i - 1));
      o.Set("first", Value::Bool(i == 0));
      o.Set("last", Value::Bool(i == len - 1));
      o.Set("length", Value::Int(len));
      o.Set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      o.Set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value());
      o.Set("cycle", Value::MakeFunction("loop.cycle", [i](Args& a) -> absl::StatusOr<Value> {
              if (a.positional.empty()) return absl::InvalidArgumentError("loop.cycle() needs at least one value");
              return a.positional[static_cast<size_t>(i) % a.positional.size()];
            }));
      scope->vars["loop"] = std::move(loop);
      Flow flow = Flow::kNormal;
      absl::Status s = Exec(n.body, scope, out, &flow);
      if (!s.ok()) {
        --loop_depth_;
        return s;
      }
      if (flow == Flow::kBreak) break;
    }
    --loop_depth_;
    return absl::OkStatus();
  }

  // A macro (or a call block's `caller`): a function rendering `n.body` in
  // a scope of its own under the one it was defined in. It holds that scope
  // weakly: the scope holds the macro.
  Value MakeMacro(const Node& n, const FramePtr& defined_in, const std::string& name) {
    const Node* node = &n;
    std::weak_ptr<Frame> weak = defined_in;
    return Value::MakeFunction(name, [this, node, weak, name](Args& a) -> absl::StatusOr<Value> {
      auto scope = std::make_shared<Frame>();
      scope->parent = weak.lock();
      if (scope->parent == nullptr) {
        return LineError(node->line, absl::StrCat("macro '", name, "' called after the scope it was defined in ended"));
      }
      const auto& params = node->params;
      if (a.positional.size() > params.size()) {
        return LineError(node->line, absl::StrCat("macro '", name, "' takes at most ", params.size(),
                                                  " arguments, got ", a.positional.size()));
      }
      for (size_t i = 0; i < params.size(); ++i) {
        Value v = a.Get(i, params[i].first);
        if (v.is_undefined() && params[i].second != nullptr) {
          ASSIGN_OR_RETURN(auto d, Eval(*params[i].second, scope));
          v = std::move(d);
        }
        scope->vars[params[i].first] = std::move(v);
      }
      for (const auto& [k, v] : a.keyword) {
        bool known = k == "caller";
        for (const auto& p : params) known = known || p.first == k;
        if (!known) return LineError(node->line, absl::StrCat("macro '", name, "' has no parameter '", k, "'"));
        if (k == "caller") scope->vars["caller"] = v;
      }
      std::string out;
      Flow flow = Flow::kNormal;
      const int saved = loop_depth_;
      loop_depth_ = 0;
      absl::Status s = Exec(node->body, scope, &out, &flow);
      loop_depth_ = saved;
      if (!s.ok()) return s;
      return Value::String(std::move(out));
    });
  }

  absl::Status EvalArgs(const Expr& e, size_t from, const FramePtr& f, Args* args) {
    for (size_t i = from; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(auto v, Eval(*e.args[i], f));
      args->positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(auto v, Eval(*x, f));
      args->keyword.emplace_back(k, std::move(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> ApplyFilters(const std::vector<ExprPtr>& filters, Value v, const FramePtr& f) {
    for (const ExprPtr& flt : filters) {
      Args args;
      RETURN_IF_ERROR(EvalArgs(*flt, 1, f, &args));
      absl::StatusOr<Value> r = ApplyFilter(flt->name, v, args);
      if (!r.ok()) return AtLine(flt->line, r.status());
      v = std::move(*r);
    }
    return v;
  }

  absl::StatusOr<Value> Eval(const Expr& e, const FramePtr& f) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = f->Lookup(e.name);
        return v != nullptr ? *v : Value();
      }
      case Expr::Kind::kList: {
        List items;
        for (const ExprPtr& x : e.args) {
          ASSIGN_OR_RETURN(auto v, Eval(*x, f));
          items.push_back(std::move(v));
        }
        return e.negated ? Value::MakeTuple(std::move(items)) : Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Value d = Value::MakeObject();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(auto k, Eval(*e.args[i], f));
          ASSIGN_OR_RETURN(auto v, Eval(*e.args[i + 1], f));
          if (!k.is_string()) return LineError(e.line, "dict keys must be strings");
          d.mutable_object().Set(k.string_value(), std::move(v));
        }
        return d;
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(auto obj, Eval(*e.args[0], f));
        if (obj.is_object()) {
          const Value* v = obj.object().Find(e.name);
          return v != nullptr ? *v : Value();
        }
        return Value();
      }
      case Expr::Kind::kIndex: {
        ASSIGN_OR_RETURN(auto obj, Eval(*e.args[0], f));
        ASSIGN_OR_RETURN(auto key, Eval(*e.args[1], f));
        return Index(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(auto obj, Eval(*e.args[0], f));
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[static_cast<size_t>(k) + 1] == nullptr) continue;
          ASSIGN_OR_RETURN(auto v, Eval(*e.args[static_cast<size_t>(k) + 1], f));
          if (!v.is_none() && v.kind() != Value::Kind::kInt) return LineError(e.line, "slice bounds must be integers");
          parts[k] = v;
        }
        if (parts[2].kind() == Value::Kind::kInt && parts[2].int_value() == 0) {
          return LineError(e.line, "slice step cannot be zero");
        }
        if (obj.is_list()) {
          List out;
          for (size_t i : SliceIndices(static_cast<int64_t>(obj.list().size()), parts[0], parts[1], parts[2])) {
            out.push_back(obj.list()[i]);
          }
          return Value::MakeList(std::move(out));
        }
        if (obj.is_string()) {
          std::vector<std::string> cps = SplitCodePoints(obj.string_value());
          std::string out;
          for (size_t i : SliceIndices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2])) out += cps[i];
          return Value::String(std::move(out));
        }
        if (obj.is_undefined()) return Value();
        return LineError(e.line, absl::StrCat("cannot slice '", obj.TypeName(), "'"));
      }
      case Expr::Kind::kCall:
        return EvalCall(e, f);
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(auto v, Eval(*e.args[0], f));
        Args args;
        RETURN_IF_ERROR(EvalArgs(e, 1, f, &args));
        absl::StatusOr<Value> r = ApplyFilter(e.name, v, args);
        if (!r.ok()) return AtLine(e.line, r.status());
        return r;
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(auto v, Eval(*e.args[0], f));
        Args args;
        RETURN_IF_ERROR(EvalArgs(e, 1, f, &args));
        absl::StatusOr<bool> r = ApplyTest(e.name, v, args);
        if (!r.ok()) return AtLine(e.line, r.status());
        return Value::Bool(*r != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(auto v, Eval(*e.args[0], f));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind() == Value::Kind::kInt) return Value::Int(e.name == "-" ? -v.int_value() : v.int_value());
        if (v.kind() == Value::Kind::kFloat) return Value::Float(e.name == "-" ? -v.float_value() : v.float_value());
        return LineError(e.line, absl::StrCat("bad operand type for unary ", e.name, ": '", v.TypeName(), "'"));
      }
      case Expr::Kind::kBinary:
        return EvalBinary(e, f);
      case Expr::Kind::kCondition: {
        ASSIGN_OR_RETURN(auto c, Eval(*e.args[1], f));
        if (c.Truthy()) return Eval(*e.args[0], f);
        if (e.args[2] == nullptr) return Value();
        return Eval(*e.args[2], f);
      }
    }
    return Value();
  }

  absl::StatusOr<Value> Index(const Value& obj, const Value& key) {
    if (obj.is_list() && key.kind() == Value::Kind::kInt) {
      int64_t i = key.int_value();
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return obj.list()[static_cast<size_t>(i)];
    }
    if (obj.is_object() && key.is_string()) {
      const Value* v = obj.object().Find(key.string_value());
      return v != nullptr ? *v : Value();
    }
    if (obj.is_string() && key.kind() == Value::Kind::kInt) {
      std::vector<std::string> cps = SplitCodePoints(obj.string_value());
      int64_t i = key.int_value();
      if (i < 0) i += static_cast<int64_t>(cps.size());
      if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value();
      return Value::String(cps[static_cast<size_t>(i)]);
    }
    return Value();
  }

  absl::StatusOr<Value> EvalCall(const Expr& e, const FramePtr& f) {
    const Expr& callee = *e.args[0];
    Args args;
    if (callee.kind == Expr::Kind::kAttr) {
      ASSIGN_OR_RETURN(auto obj, Eval(*callee.args[0], f));
      const Value* member = obj.is_object() ? obj.object().Find(callee.name) : nullptr;
      RETURN_IF_ERROR(EvalArgs(e, 1, f, &args));
      absl::StatusOr<Value> r = member != nullptr && member->is_function() ? member->Call(args)
                                : obj.is_undefined()
                                    ? absl::StatusOr<Value>(absl::InvalidArgumentError(absl::StrCat(
                                          "cannot call '", callee.name, "' on an undefined value")))
                                    : CallMethod(obj, callee.name, args);
      if (!r.ok()) return AtLine(e.line, r.status());
      return r;
    }
    ASSIGN_OR_RETURN(auto fn, Eval(callee, f));
    if (!fn.is_function()) {
      return LineError(e.line, callee.kind == Expr::Kind::kName
                                   ? absl::StrCat("'", callee.name, "' is ", fn.is_undefined() ? "undefined" : "not callable")
                                   : absl::StrCat("'", fn.TypeName(), "' object is not callable"));
    }
    RETURN_IF_ERROR(EvalArgs(e, 1, f, &args));
    absl::StatusOr<Value> r = fn.Call(args);
    if (!r.ok()) return AtLine(e.line, r.status());
    return r;
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e, const FramePtr& f) {
    const std::string& op = e.name;
    ASSIGN_OR_RETURN(auto a, Eval(*e.args[0], f));
    if (op == "and") {
      if (!a.Truthy()) return a;
      return Eval(*e.args[1], f);
    }
    if (op == "or") {
      if (a.Truthy()) return a;
      return Eval(*e.args[1], f);
    }
    ASSIGN_OR_RETURN(auto b, Eval(*e.args[1], f));
    if (op == "~") return Value::String(a.Str() + b.Str());
    if (op == "==") return Value::Bool(a.Equals(b));
    if (op == "!=") return Value::Bool(!a.Equals(b));
    if (op == "in" || op == "not in") {
      Args args;
      args.positional.push_back(b);
      absl::StatusOr<bool> r = ApplyTest("in", a, args);
      if (!r.ok()) return AtLine(e.line, r.status());
      return Value::Bool(*r == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      Args args;
      args.positional.push_back(b);
      absl::StatusOr<bool> r = ApplyTest(op, a, args);
      if (!r.ok()) return AtLine(e.line, r.status());
      return Value::Bool(*r);
    }
    auto type_error = [&]() {
      return LineError(e.line, absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(), "' and '",
                                            b.TypeName(), "'"));
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.string_value() + b.string_value());
      if (a.is_list() && b.is_list()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value::MakeList(std::move(l));
      }
    }
    if (op == "*") {
      const Value* s = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* n = s == &a ? &b : &a;
      if (s != nullptr && n->kind() == Value::Kind::kInt) {
        if (s->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n->int_value(); ++i) out += s->string_value();
          return Value::String(out);
        }
        List l;
        for (int64_t i = 0; i < n->int_value(); ++i) l.insert(l.end(), s->list().begin(), s->list().end());
        return Value::MakeList(std::move(l));
      }
    }
    auto num = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
    if (!num(a) || !num(b)) return type_error();
    auto as_int = [](const Value& v) { return v.kind() == Value::Kind::kBool ? int64_t{v.bool_value()} : v.int_value(); };
    const bool ints = a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat;
    const double x = a.kind() == Value::Kind::kBool ? double(a.bool_value()) : a.float_value();
    const double y = b.kind() == Value::Kind::kBool ? double(b.bool_value()) : b.float_value();
    if (op == "+") return ints ? Value::Int(as_int(a) + as_int(b)) : Value::Float(x + y);
    if (op == "-") return ints ? Value::Int(as_int(a) - as_int(b)) : Value::Float(x - y);
    if (op == "*") return ints ? Value::Int(as_int(a) * as_int(b)) : Value::Float(x * y);
    if (op == "**") {
      if (ints && as_int(b) >= 0) return Value::Int(static_cast<int64_t>(std::llround(std::pow(x, y))));
      return Value::Float(std::pow(x, y));
    }
    if (y == 0) return LineError(e.line, "division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") {
      if (ints) {
        int64_t q = as_int(a) / as_int(b);
        if ((as_int(a) % as_int(b) != 0) && ((as_int(a) < 0) != (as_int(b) < 0))) --q;
        return Value::Int(q);
      }
      return Value::Float(std::floor(x / y));
    }
    if (op == "%") {
      if (ints) {
        int64_t r = as_int(a) % as_int(b);
        if (r != 0 && ((r < 0) != (as_int(b) < 0))) r += as_int(b);
        return Value::Int(r);
      }
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::Float(r);
    }
    return type_error();
  }

  int loop_depth_ = 0;
};

// Checks what Parse can: every filter and test named exists.
absl::Status CheckExpr(const Expr* e) {
  if (e == nullptr) return absl::OkStatus();
  if (e->kind == Expr::Kind::kFilter && !IsFilter(e->name)) {
    return LineError(e->line, absl::StrCat("unknown filter '", e->name, "'"));
  }
  if (e->kind == Expr::Kind::kTest && !IsTest(e->name)) {
    return LineError(e->line, absl::StrCat("unknown test '", e->name, "'"));
  }
  for (const ExprPtr& a : e->args) {
    if (absl::Status s = CheckExpr(a.get()); !s.ok()) return s;
  }
  for (const auto& [k, a] : e->kwargs) {
    if (absl::Status s = CheckExpr(a.get()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Calls `visit` on every expression of `body`, depth first.
absl::Status Walk(const Body& body, const std::function<absl::Status(const Expr*)>& visit) {
  for (const NodePtr& n : body) {
    for (const Expr* e : {n->expr.get(), n->filter.get()}) {
      if (absl::Status s = visit(e); !s.ok()) return s;
    }
    for (const ExprPtr& e : n->filters) {
      if (absl::Status s = visit(e.get()); !s.ok()) return s;
    }
    for (const auto& [p, d] : n->params) {
      if (absl::Status s = visit(d.get()); !s.ok()) return s;
    }
    for (const auto& [c, b] : n->branches) {
      if (absl::Status s = visit(c.get()); !s.ok()) return s;
      if (absl::Status s = Walk(b, visit); !s.ok()) return s;
    }
    if (absl::Status s = Walk(n->body, visit); !s.ok()) return s;
    if (absl::Status s = Walk(n->else_body, visit); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool ExprReads(const Expr* e, absl::string_view name) {
  if (e == nullptr) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const ExprPtr& a : e->args) {
    if (ExprReads(a.get(), name)) return true;
  }
  for (const auto& [k, a] : e->kwargs) {
    if (ExprReads(a.get(), name)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  absl::StatusOr<std::vector<Token>> tokens = Lex(source);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<Body> body = jinja::Parse(*tokens);
  if (!body.ok()) return body.status();
  if (absl::Status s = Walk(*body, CheckExpr); !s.ok()) return s;
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(*body));
  return t;
}

absl::StatusOr<std::string> Template::Render(const Value& context) const {
  auto globals = std::make_shared<Frame>();
  const Value g = Globals();
  for (const auto& [k, v] : g.object().items) globals->vars[k] = v;
  auto top = std::make_shared<Frame>();
  top->parent = globals;
  if (context.is_object()) {
    for (const auto& [k, v] : context.object().items) top->vars[k] = v;
  }
  Interpreter interp;
  std::string out;
  Flow flow = Flow::kNormal;
  if (absl::Status s = interp.Exec(*body_, top, &out, &flow); !s.ok()) return s;
  return out;
}

bool Template::Reads(absl::string_view name) const {
  bool found = false;
  Walk(*body_, [&](const Expr* e) {
    found = found || ExprReads(e, name);
    return absl::OkStatus();
  }).IgnoreError();
  return found;
}

}  // namespace duet::text::jinja

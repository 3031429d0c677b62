#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace duet::text::jinja {
namespace {


constexpr absl::string_view kWhitespace = " \t\n\r\f\v";

absl::Status Error(absl::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

std::string Strip(absl::string_view s, const Value& chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.string_value() : std::string(kWhitespace);
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && set.find(s[b]) != std::string::npos) ++b;
  }
  if (right) {
    while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  }
  return std::string(s.substr(b, e - b));
}

// Python's ordering of two values (numbers, strings; lists item by item).
absl::StatusOr<int> Compare(const Value& a, const Value& b, bool case_sensitive = true) {
  if (a.is_number() && b.is_number()) {
    const double x = a.float_value(), y = b.float_value();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    if (case_sensitive) return a.string_value().compare(b.string_value()) < 0 ? -1 : a.string_value() == b.string_value() ? 0 : 1;
    const std::string x = absl::AsciiStrToLower(a.string_value()), y = absl::AsciiStrToLower(b.string_value());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind() == Value::Kind::kBool && b.kind() == Value::Kind::kBool) return int(a.bool_value()) - int(b.bool_value());
  return Error(absl::StrCat("'<' is not supported between '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

// value.attr for dotted `attr` ("a.b"); integer parts index lists.
Value AttrPath(const Value& v, absl::string_view attr) {
  Value cur = v;
  for (absl::string_view part : absl::StrSplit(attr, '.')) {
    int64_t idx = 0;
    if (cur.is_object()) {
      const Value* x = cur.object().Find(part);
      cur = x != nullptr ? *x : Value();
    } else if (cur.is_list() && absl::SimpleAtoi(part, &idx) && idx >= 0 &&
               static_cast<size_t>(idx) < cur.list().size()) {
      cur = cur.list()[static_cast<size_t>(idx)];
    } else {
      return Value();
    }
  }
  return cur;
}

Args Rest(Args& args, size_t from) {
  Args out;
  for (size_t i = from; i < args.positional.size(); ++i) out.positional.push_back(args.positional[i]);
  out.keyword = args.keyword;
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out(s);
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (alpha) c = prev_alpha ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
    prev_alpha = alpha;
  }
  return out;
}

// Jinja's title filter: each word (split at whitespace, '-', and opening
// brackets) gets an upper-case first letter and lower-case rest.
std::string JinjaTitle(absl::string_view s) {
  std::string out(s);
  bool start = true;
  for (char& c : out) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '-' || c == '(' || c == '{' || c == '[' ||
        c == '<') {
      start = true;
      continue;
    }
    c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
    start = false;
  }
  return out;
}

std::string Capitalize(absl::string_view s) {
  std::string out = absl::AsciiStrToLower(s);
  if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
  return out;
}

absl::StatusOr<Value> Replace(const std::string& s, const Value& from, const Value& to, const Value& count) {
  if (!from.is_string() || !to.is_string()) return Error("replace() takes strings");
  int64_t n = count.kind() == Value::Kind::kInt ? count.int_value() : -1;
  const std::string& a = from.string_value();
  const std::string& b = to.string_value();
  std::string out;
  if (a.empty()) {
    // Python inserts `b` between characters (and at both ends).
    std::vector<std::string> cps = SplitCodePoints(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (n != 0) {
        out += b;
        --n;
      }
      if (i < cps.size()) out += cps[i];
    }
    return Value::String(out);
  }
  size_t pos = 0;
  while (n != 0) {
    size_t at = s.find(a, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += b;
    pos = at + a.size();
    --n;
  }
  out.append(s, pos, std::string::npos);
  return Value::String(out);
}

// Python's str.split(sep=None, maxsplit=-1).
Value Split(const std::string& s, const Value& sep, const Value& maxsplit) {
  int64_t max = maxsplit.kind() == Value::Kind::kInt ? maxsplit.int_value() : -1;
  List out;
  if (!sep.is_string()) {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && kWhitespace.find(s[i]) != absl::string_view::npos) ++i;
      if (i >= s.size()) break;
      if (max == 0) {
        size_t e = s.size();
        while (e > i && kWhitespace.find(s[e - 1]) != absl::string_view::npos) --e;
        out.push_back(Value::String(s.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && kWhitespace.find(s[j]) == absl::string_view::npos) ++j;
      out.push_back(Value::String(s.substr(i, j - i)));
      --max;
      i = j;
    }
    return Value::MakeList(std::move(out));
  }
  const std::string& d = sep.string_value();
  if (d.empty()) return Value::MakeList({Value::String(s)});  // Python raises; keep the text
  size_t pos = 0;
  while (max != 0) {
    size_t at = s.find(d, pos);
    if (at == std::string::npos) break;
    out.push_back(Value::String(s.substr(pos, at - pos)));
    pos = at + d.size();
    --max;
  }
  out.push_back(Value::String(s.substr(pos)));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<bool> AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) -> absl::StatusOr<bool> {
    if (!a.is_string()) return Error(absl::StrCat(prefix ? "startswith" : "endswith", "() takes a string"));
    return prefix ? absl::StartsWith(s, a.string_value()) : absl::EndsWith(s, a.string_value());
  };
  if (affix.is_list()) {
    for (const Value& a : affix.list()) {
      absl::StatusOr<bool> m = one(a);
      if (!m.ok() || *m) return m;
    }
    return false;
  }
  return one(affix);
}

absl::StatusOr<Value> ToInt(const Value& v, const Value& fallback) {
  const Value def = fallback.is_undefined() ? Value::Int(0) : fallback;
  switch (v.kind()) {
    case Value::Kind::kInt:
      return v;
    case Value::Kind::kBool:
      return Value::Int(v.bool_value() ? 1 : 0);
    case Value::Kind::kFloat:
      return Value::Int(static_cast<int64_t>(v.float_value()));
    case Value::Kind::kString: {
      int64_t i = 0;
      double d = 0;
      const std::string s = Strip(v.string_value(), Value(), true, true);
      if (absl::SimpleAtoi(s, &i)) return Value::Int(i);
      if (absl::SimpleAtod(s, &d)) return Value::Int(static_cast<int64_t>(d));
      return def;
    }
    default:
      return def;
  }
}

absl::StatusOr<Value> Filter(absl::string_view name, const Value& v, Args& a) {
  const bool str = v.is_string();
  const std::string& s = v.string_value();
  if (name == "trim") return Value::String(Strip(v.Str(), a.Get(0, "chars"), true, true));  // str() first
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    const std::string t = v.Str();
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(t));
    if (name == "lower") return Value::String(absl::AsciiStrToLower(t));
    if (name == "capitalize") return Value::String(Capitalize(t));
    return Value::String(JinjaTitle(t));
  }
  if (name == "tojson") {
    JsonOptions o;
    Value indent = a.Get(0, "indent");
    if (indent.kind() == Value::Kind::kInt) {
      o.indent = static_cast<int>(indent.int_value());
    } else if (!indent.is_undefined() && !indent.is_none()) {
      return Error("tojson: indent must be an integer");
    }
    o.ensure_ascii = a.Get(99, "ensure_ascii").Truthy();
    o.sort_keys = a.Get(99, "sort_keys").Truthy();
    Value seps = a.Get(99, "separators");
    if (seps.is_list()) {
      if (seps.list().size() != 2 || !seps.list()[0].is_string() || !seps.list()[1].is_string()) {
        return Error("tojson: separators must be two strings");
      }
      o.separators = std::make_pair(seps.list()[0].string_value(), seps.list()[1].string_value());
    }
    absl::StatusOr<std::string> j = ToJson(v, o);
    if (!j.ok()) return j.status();
    return Value::String(*j);
  }
  if (name == "length" || name == "count") {
    if (str) return Value::Int(static_cast<int64_t>(CodePoints(s)));
    if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.is_object()) return Value::Int(static_cast<int64_t>(v.object().items.size()));
    if (v.is_undefined()) return Value::Int(0);
    return Error(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
  if (name == "join") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value sep = a.Get(0, "d");
    const Value attr = a.Get(1, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (i > 0) out += sep.Str();
      out += attr.is_string() ? AttrPath((*items)[i], attr.string_value()).Str() : (*items)[i].Str();
    }
    return Value::String(out);
  }
  if (name == "replace") {
    return Replace(v.Str(), a.Get(0, "old"), a.Get(1, "new"), a.Get(2, "count"));
  }
  if (name == "default" || name == "d") {
    const bool boolean = a.Get(1, "boolean").Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) {
      Value d = a.Get(0, "default_value");
      return d.is_undefined() ? Value::String("") : d;
    }
    return v;
  }
  if (name == "list") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    return Value::MakeList(*items);
  }
  if (name == "items" || name == "dictsort") {
    List out;
    if (v.is_object()) {
      for (const auto& [k, x] : v.object().items) out.push_back(Value::MakeTuple({Value::String(k), x}));
    } else if (!v.is_undefined()) {
      return Error(absl::StrCat(name, ": expected a mapping, got ", v.TypeName()));
    }
    if (name == "dictsort") {
      const bool cs = a.Get(0, "case_sensitive").Truthy();
      const bool by_value = a.Get(1, "by").Str() == "value";
      const bool rev = a.Get(2, "reverse").Truthy();
      absl::Status err;
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        absl::StatusOr<int> c = Compare(x.list()[by_value ? 1 : 0], y.list()[by_value ? 1 : 0], cs);
        if (!c.ok()) err = c.status();
        return c.ok() && (rev ? *c > 0 : *c < 0);
      });
      if (!err.ok()) return err;
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "first" || name == "last") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value();
    return name == "first" ? items->front() : items->back();
  }
  if (name == "reverse") {
    if (str) {
      std::vector<std::string> cps = SplitCodePoints(s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::String(out);
    }
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value::MakeList(*items);
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    const bool rev = name == "sort" && a.Get(0, "reverse").Truthy();
    const bool cs = a.Get(name == "sort" ? 1 : 0, "case_sensitive").Truthy();
    const Value attr = a.Get(name == "sort" ? 2 : 1, "attribute");
    auto key = [&](const Value& x) { return attr.is_string() ? AttrPath(x, attr.string_value()) : x; };
    if (name == "unique") {
      List out;
      for (const Value& x : *items) {
        bool seen = false;
        for (const Value& y : out) {
          absl::StatusOr<int> c = Compare(key(x), key(y), cs);
          seen = seen || (c.ok() ? *c == 0 : key(x).Equals(key(y)));
        }
        if (!seen) out.push_back(x);
      }
      return Value::MakeList(std::move(out));
    }
    absl::Status err;
    auto less = [&](const Value& x, const Value& y) {
      absl::StatusOr<int> c = Compare(key(x), key(y), cs);
      if (!c.ok()) err = c.status();
      return c.ok() && *c < 0;
    };
    if (name == "sort") {
      std::stable_sort(items->begin(), items->end(), [&](const Value& x, const Value& y) { return rev ? less(y, x) : less(x, y); });
      if (!err.ok()) return err;
      return Value::MakeList(*items);
    }
    if (items->empty()) return Value();
    auto it = name == "min" ? std::min_element(items->begin(), items->end(), less)
                            : std::max_element(items->begin(), items->end(), less);
    if (!err.ok()) return err;
    return *it;
  }
  if (name == "map") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    List out;
    const Value attr = a.Get(99, "attribute");
    if (attr.is_string()) {
      const Value def = a.Get(99, "default");
      for (const Value& x : *items) {
        Value y = AttrPath(x, attr.string_value());
        out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
      }
      return Value::MakeList(std::move(out));
    }
    const Value filter = a.Get(0, "");
    if (!filter.is_string()) return Error("map: give a filter name or attribute=");
    if (!IsFilter(filter.string_value())) return Error(absl::StrCat("map: no filter named '", filter.string_value(), "'"));
    Args rest = Rest(a, 1);
    for (const Value& x : *items) {
      absl::StatusOr<Value> y = Filter(filter.string_value(), x, rest);
      if (!y.ok()) return y.status();
      out.push_back(*y);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    const size_t test_at = by_attr ? 1 : 0;
    Value attr = by_attr ? a.Get(0, "") : Value();
    if (by_attr && !attr.is_string()) return Error(absl::StrCat(name, ": the attribute must be a string"));
    const Value test = a.Get(test_at, "");
    if (!test.is_undefined() && !test.is_string()) return Error(absl::StrCat(name, ": the test must be a name"));
    if (test.is_string() && !IsTest(test.string_value())) {
      return Error(absl::StrCat(name, ": no test named '", test.string_value(), "'"));
    }
    Args rest = Rest(a, test_at + 1);
    List out;
    for (const Value& x : *items) {
      const Value subject = by_attr ? AttrPath(x, attr.string_value()) : x;
      bool pass = subject.Truthy();
      if (test.is_string()) {
        absl::StatusOr<bool> r = ApplyTest(test.string_value(), subject, rest);
        if (!r.ok()) return r.status();
        pass = *r;
      }
      if (pass == keep_if) out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "string") return Value::String(v.Str());
  if (name == "safe" || name == "escape" || name == "e" || name == "forceescape") {
    if (name == "safe") return v.is_string() ? v : Value::String(v.Str());
    return Value::String(absl::StrReplaceAll(
        v.Str(), {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&#34;"}, {"'", "&#39;"}}));
  }
  if (name == "int") return ToInt(v, a.Get(0, "default"));
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.float_value());
    double d = 0;
    if (str && absl::SimpleAtod(Strip(s, Value(), true, true), &d)) return Value::Float(d);
    Value def = a.Get(0, "default");
    return def.is_undefined() ? Value::Float(0) : def;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kInt) return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
    if (v.is_number()) return Value::Float(std::fabs(v.float_value()));
    return Error(absl::StrCat("abs: expected a number, got ", v.TypeName()));
  }
  if (name == "round") {
    if (!v.is_number()) return Error(absl::StrCat("round: expected a number, got ", v.TypeName()));
    Value p = a.Get(0, "precision");
    const int64_t prec = p.kind() == Value::Kind::kInt ? p.int_value() : 0;
    const std::string method = a.Get(1, "method").is_string() ? a.Get(1, "method").string_value() : "common";
    const double scale = std::pow(10.0, static_cast<double>(prec));
    double x = v.float_value() * scale;
    x = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::Float(x / scale);
  }
  if (name == "sum") {
    absl::StatusOr<List> items = Iterate(v);
    if (!items.ok()) return items.status();
    const Value attr = a.Get(0, "attribute");
    Value start = a.Get(1, "start");
    bool is_float = start.kind() == Value::Kind::kFloat;
    double fsum = start.is_number() ? start.float_value() : 0;
    int64_t isum = start.kind() == Value::Kind::kInt ? start.int_value() : 0;
    for (const Value& x : *items) {
      const Value y = attr.is_string() ? AttrPath(x, attr.string_value()) : x;
      if (!y.is_number()) return Error(absl::StrCat("sum: cannot add ", y.TypeName()));
      is_float = is_float || y.kind() == Value::Kind::kFloat;
      fsum += y.float_value();
      if (y.kind() == Value::Kind::kInt) isum += y.int_value();
    }
    return is_float ? Value::Float(fsum) : Value::Int(isum);
  }
  if (name == "indent") {
    Value w = a.Get(0, "width");
    const std::string pad = w.is_string() ? w.string_value()
                                          : std::string(w.kind() == Value::Kind::kInt ? w.int_value() : 4, ' ');
    const bool first = a.Get(1, "first").Truthy(), blank = a.Get(2, "blank").Truthy();
    std::vector<std::string> lines = absl::StrSplit(v.Str(), '\n');
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += '\n';
      if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
      out += lines[i];
    }
    return Value::String(out);
  }
  if (name == "wordcount") {
    return Value::Int(static_cast<int64_t>(Split(v.Str(), Value(), Value()).list().size()));
  }
  if (name == "attr") {
    const Value attr = a.Get(0, "name");
    if (!attr.is_string()) return Error("attr: the name must be a string");
    if (!v.is_object()) return Value();
    const Value* x = v.object().Find(attr.string_value());
    return x != nullptr ? *x : Value();
  }
  return absl::NotFoundError(absl::StrCat("no filter named '", name, "'"));
}

constexpr const char* kFilters[] = {"trim",   "upper",     "lower",      "capitalize", "title",  "tojson",  "length",
                                    "count",  "join",      "replace",    "default",    "d",      "list",    "items",
                                    "dictsort", "first",   "last",       "reverse",    "sort",   "unique",  "min",
                                    "max",    "map",       "select",     "reject",     "selectattr", "rejectattr",
                                    "string", "safe",      "escape",     "e",          "forceescape", "int", "float",
                                    "abs",    "round",     "sum",        "indent",     "wordcount", "attr"};
constexpr const char* kTests[] = {"defined", "undefined", "none",    "boolean",  "false",   "true",       "integer",
                                  "float",   "number",    "string",  "mapping",  "iterable", "sequence",  "callable",
                                  "sameas",  "even",      "odd",     "divisibleby", "eq",   "equalto",    "==",
                                  "ne",      "!=",        "lt",      "lessthan", "<",       "le",         "<=",
                                  "gt",      "greaterthan", ">",     "ge",       ">=",      "in",         "lower",
                                  "upper",   "filter",    "test"};

}  // namespace

absl::StatusOr<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kObject: {
      List keys;
      for (const auto& [k, x] : v.object().items) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (std::string& c : SplitCodePoints(v.string_value())) chars.push_back(Value::String(std::move(c)));
      return chars;
    }
    default:
      return Error(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

bool IsFilter(absl::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}
bool IsTest(absl::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand, Args& args) {
  return Filter(name, operand, args);
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, Args& a) {
  using K = Value::Kind;
  const Value other = a.Get(0, "value");
  auto ordered = [&](bool (*pred)(int)) -> absl::StatusOr<bool> {
    absl::StatusOr<int> c = Compare(v, other);
    if (!c.ok()) return c.status();
    return pred(*c);
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "false") return v.kind() == K::kBool && !v.bool_value();
  if (name == "true") return v.kind() == K::kBool && v.bool_value();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_object();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && absl::AsciiStrToLower(v.string_value()) == v.string_value();
  if (name == "upper") return v.is_string() && absl::AsciiStrToUpper(v.string_value()) == v.string_value();
  if (name == "filter") return other.is_string() && IsFilter(other.string_value());
  if (name == "test") return other.is_string() && IsTest(other.string_value());
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (v.kind() != K::kInt) return Error(absl::StrCat("the '", name, "' test needs an integer, got ", v.TypeName()));
    if (name == "divisibleby") {
      if (other.kind() != K::kInt || other.int_value() == 0) return Error("divisibleby needs a non-zero integer");
      return v.int_value() % other.int_value() == 0;
    }
    return (v.int_value() % 2 == 0) == (name == "even");
  }
  if (name == "sameas") {
    if (v.is_list() || v.is_object()) return v.kind() == other.kind() && v.Equals(other);
    return v.kind() == other.kind() && v.Equals(other);
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(other);
  if (name == "ne" || name == "!=") return !v.Equals(other);
  if (name == "lt" || name == "lessthan" || name == "<") return ordered([](int c) { return c < 0; });
  if (name == "le" || name == "<=") return ordered([](int c) { return c <= 0; });
  if (name == "gt" || name == "greaterthan" || name == ">") return ordered([](int c) { return c > 0; });
  if (name == "ge" || name == ">=") return ordered([](int c) { return c >= 0; });
  if (name == "in") {
    if (other.is_string()) return v.is_string() && other.string_value().find(v.string_value()) != std::string::npos;
    if (other.is_list()) {
      for (const Value& x : other.list()) {
        if (x.Equals(v)) return true;
      }
      return false;
    }
    if (other.is_object()) return v.is_string() && other.object().Find(v.string_value()) != nullptr;
    return Error(absl::StrCat("the 'in' test needs a container, got ", other.TypeName()));
  }
  return absl::NotFoundError(absl::StrCat("no test named '", name, "'"));
}

absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, Args& a) {
  if (obj.is_string()) {
    const std::string& s = obj.string_value();
    if (name == "strip") return Value::String(Strip(s, a.Get(0, "chars"), true, true));
    if (name == "lstrip") return Value::String(Strip(s, a.Get(0, "chars"), true, false));
    if (name == "rstrip") return Value::String(Strip(s, a.Get(0, "chars"), false, true));
    if (name == "split") return Split(s, a.Get(0, "sep"), a.Get(1, "maxsplit"));
    if (name == "startswith" || name == "endswith") {
      absl::StatusOr<bool> m = AffixMatch(s, a.Get(0, "prefix"), name == "startswith");
      if (!m.ok()) return m.status();
      return Value::Bool(*m);
    }
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
    if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(Capitalize(s));
    if (name == "replace") return Replace(s, a.Get(0, "old"), a.Get(1, "new"), a.Get(2, "count"));
    if (name == "find" || name == "count") {
      const Value sub = a.Get(0, "sub");
      if (!sub.is_string()) return Error(absl::StrCat(name, "() takes a string"));
      if (name == "find") {
        size_t at = s.find(sub.string_value());
        return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePoints(s.substr(0, at))));
      }
      if (sub.string_value().empty()) return Value::Int(static_cast<int64_t>(CodePoints(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(sub.string_value()); at != std::string::npos;
           at = s.find(sub.string_value(), at + sub.string_value().size())) {
        ++n;
      }
      return Value::Int(n);
    }
    if (name == "join") {
      absl::StatusOr<List> items = Iterate(a.Get(0, "iterable"));
      if (!items.ok()) return items.status();
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        if (!(*items)[i].is_string()) return Error("join() takes strings");
        absl::StrAppend(&out, i > 0 ? s : "", (*items)[i].string_value());
      }
      return Value::String(out);
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace") {
      if (s.empty()) return Value::Bool(false);
      for (unsigned char c : s) {
        const bool ok = name == "isdigit" ? absl::ascii_isdigit(c) : name == "isalpha" ? absl::ascii_isalpha(c) : absl::ascii_isspace(c);
        if (!ok) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
  } else if (obj.is_object()) {
    if (name == "items" || name == "keys" || name == "values") {
      List out;
      for (const auto& [k, x] : obj.object().items) {
        out.push_back(name == "items" ? Value::MakeTuple({Value::String(k), x}) : name == "keys" ? Value::String(k) : x);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "get") {
      const Value key = a.Get(0, "key");
      const Value* x = key.is_string() ? obj.object().Find(key.string_value()) : nullptr;
      if (x != nullptr) return *x;
      const Value def = a.Get(1, "default");
      return def.is_undefined() ? Value::None() : def;
    }
  }
  return Error(absl::StrCat("'", obj.TypeName(), "' object has no method '", name, "'"));
}

Value Globals() {
  Value g = Value::MakeObject();
  Object& o = g.mutable_object();
  o.Set("range", Value::MakeFunction("range", [](Args& a) -> absl::StatusOr<Value> {
          for (const Value& x : a.positional) {
            if (x.kind() != Value::Kind::kInt) return Error("range() takes integers");
          }
          int64_t start = 0, stop = 0, step = 1;
          if (a.positional.size() == 1) {
            stop = a.positional[0].int_value();
          } else if (a.positional.size() >= 2) {
            start = a.positional[0].int_value();
            stop = a.positional[1].int_value();
            if (a.positional.size() >= 3) step = a.positional[2].int_value();
          } else {
            return Error("range() takes 1 to 3 integers");
          }
          if (step == 0) return Error("range() step must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000) return Error("range() is too long");
            out.push_back(Value::Int(i));
          }
          return Value::MakeList(std::move(out));
        }));
  auto from_keywords = [](Value v, Args& a) -> absl::StatusOr<Value> {
    if (!a.positional.empty() && a.positional[0].is_object()) {
      for (const auto& [k, x] : a.positional[0].object().items) v.mutable_object().Set(k, x);
    }
    for (const auto& [k, x] : a.keyword) v.mutable_object().Set(k, x);
    return v;
  };
  o.Set("namespace", Value::MakeFunction("namespace", [from_keywords](Args& a) {
          return from_keywords(Value::MakeNamespace(), a);
        }));
  o.Set("dict", Value::MakeFunction("dict", [from_keywords](Args& a) { return from_keywords(Value::MakeObject(), a); }));
  o.Set("raise_exception", Value::MakeFunction("raise_exception", [](Args& a) -> absl::StatusOr<Value> {
          return absl::InvalidArgumentError(absl::StrCat("the template raised: ", a.Get(0, "message").Str()));
        }));
  o.Set("strftime_now", Value::MakeFunction("strftime_now", [](Args& a) -> absl::StatusOr<Value> {
          const Value fmt = a.Get(0, "format");
          if (!fmt.is_string()) return Error("strftime_now() takes a format string");
          std::time_t now = std::time(nullptr);
          std::tm tm;
          localtime_r(&now, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf), fmt.string_value().c_str(), &tm);
          return Value::String(std::string(buf, n));
        }));
  return g;
}

}  // namespace duet::text::jinja

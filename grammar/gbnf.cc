#include "grammar/gbnf.h"

#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace duet::grammar {
namespace {

// The terminals of Lark's `common` library that `%import common.NAME`
// brings in, as regexes over the text (Lark's own definitions).
const std::map<std::string, std::string>& LarkCommon() {
  static const auto* m = new std::map<std::string, std::string>{
      {"DIGIT", "[0-9]"},
      {"HEXDIGIT", "[a-fA-F0-9]"},
      {"INT", "[0-9]+"},
      {"SIGNED_INT", "[+-]?[0-9]+"},
      {"DECIMAL", "[0-9]+\\.[0-9]*|\\.[0-9]+"},
      {"FLOAT", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?"},
      {"SIGNED_FLOAT", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?)"},
      {"NUMBER", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+"},
      {"SIGNED_NUMBER", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+)"},
      {"LCASE_LETTER", "[a-z]"},
      {"UCASE_LETTER", "[A-Z]"},
      {"LETTER", "[a-zA-Z]"},
      {"WORD", "[a-zA-Z]+"},
      {"CNAME", "[_a-zA-Z][_a-zA-Z0-9]*"},
      {"WS_INLINE", "[ \\t]+"},
      {"WS", "[ \\t\\f\\r\\n]+"},
      {"CR", "\\r"},
      {"LF", "\\n"},
      {"NEWLINE", "(\\r?\\n)+"},
      {"ESCAPED_STRING", "\"([^\"\\\\\\n]|\\\\[^\\n])*\""},
  };
  return *m;
}

class GbnfCompiler {
 public:
  // `lark`: the Lark dialect (see gbnf.h) instead of GBNF.
  GbnfCompiler(std::string_view text, Grammar& g, bool lark) : t_(text), g_(g), lark_(lark) {}

  absl::Status Compile() {
    // Rule names first, so references may come before definitions.
    std::vector<std::pair<std::string, size_t>> bodies;
    Skip();
    while (pos_ < t_.size()) {
      if (lark_ && t_[pos_] == '%') {
        RETURN_IF_ERROR(Directive());
        Skip();
        continue;
      }
      const size_t at = pos_;
      if (lark_ && (t_[pos_] == '?' || t_[pos_] == '!')) ++pos_;  // inlined / kept: the same text
      std::string name = Name();
      if (name.empty()) return Error("a rule name");
      if (lark_) {
        if (pos_ < t_.size() && t_[pos_] == '{') return Refuse("a rule template ('name{...}') is not supported");
        if (pos_ < t_.size() && t_[pos_] == '.') {  // a priority: no bearing on what matches
          ++pos_;
          while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
        }
      }
      Skip();
      if (lark_) {
        if (pos_ >= t_.size() || t_[pos_] != ':' || t_.substr(pos_, 2) == "::") return Error("':'");
        pos_ += 1;
      } else {
        if (t_.substr(pos_, 3) != "::=") return Error("'::='");
        pos_ += 3;
      }
      if (rules_.count(name)) {
        pos_ = at;
        return Error(absl::StrCat("one definition of rule '", name, "'"));
      }
      rules_[name] = NewNode(NodeKind::kUnion);
      bodies.push_back({name, pos_});
      SkipBody();
    }
    const char* start = lark_ ? "start" : "root";
    if (!rules_.count(start)) return absl::InvalidArgumentError(absl::StrCat("grammar: no rule '", start, "'"));
    for (const auto& [name, start] : bodies) {
      pos_ = start;
      rule_ = name;
      ASSIGN_OR_RETURN(int32_t body, Alternation(/*nested=*/false));
      g_.nodes[rules_[name]].alternatives = {body};
    }
    g_.root = rules_[start];
    g_.ComputeNullable();
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      if (n.kind == NodeKind::kRepeat && g_.nullable[n.repeat]) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: rule '", rule_of_[i], "' repeats something that may be empty"));
      }
    }
    std::vector<char> color(g_.nodes.size(), 0);
    for (const auto& [name, id] : rules_) {
      if (LeftRecursive(id, color)) {
        return absl::InvalidArgumentError(absl::StrCat("grammar: rule '", name, "' is left-recursive"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(std::string_view expected) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, " column ", col,
                                                   rule_.empty() ? "" : absl::StrCat(" (rule '", rule_, "')"),
                                                   ": expected ", std::string(expected)));
  }

  // A construct read but not supported, at the current position.
  absl::Status Refuse(std::string_view what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, " column ", col, ": ", std::string(what)));
  }

  // A node matching `pattern` (an ECMA regex) whole.
  absl::StatusOr<int32_t> RegexNode(const std::string& pattern) {
    auto d = CompileRegex(absl::StrCat("^(?:", pattern, ")$"));
    if (!d.ok()) return Error(absl::StrCat("a regex duet supports (", d.status().message(), ")"));
    const int32_t n = NewNode(NodeKind::kRaw);
    g_.nodes[n].dfa = static_cast<int32_t>(g_.dfas.size());
    g_.dfas.push_back(std::make_shared<const ByteDfa>(std::move(*d)));
    return n;
  }

  // Lark's `%import common.NAME` and `%import common (A, B)`; other
  // directives are refused by name.
  absl::Status Directive() {
    const size_t at = pos_;
    ++pos_;
    const std::string d = Name();
    if (d != "import") {
      pos_ = at;
      return Refuse(absl::StrCat("%", d, " is not supported (duet's Lark grammars take the text as the rules write "
                                 "it: no ignored terminals; write the whitespace into the rules)"));
    }
    Skip(/*stop_at_newline=*/true);
    if (t_.substr(pos_, 6) != "common") return Error("'common' (the only library duet knows)");
    pos_ += 6;
    std::vector<std::pair<std::string, size_t>> names;  // and where each is
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      const size_t name_at = pos_;
      names.push_back({Name(), name_at});
    } else {
      Skip(true);
      if (pos_ >= t_.size() || t_[pos_] != '(') return Error("'.NAME' or '(NAME, ...)'");
      ++pos_;
      while (true) {
        Skip();
        const size_t name_at = pos_;
        names.push_back({Name(), name_at});
        Skip();
        if (pos_ < t_.size() && t_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ >= t_.size() || t_[pos_] != ')') return Error("')'");
        ++pos_;
        break;
      }
    }
    Skip(true);
    if (t_.substr(pos_, 2) == "->") return Refuse("an import alias ('->') is not supported");
    for (const auto& [n, name_at] : names) {
      auto it = LarkCommon().find(n);
      if (it == LarkCommon().end()) {
        pos_ = name_at;
        return Error(absl::StrCat("a terminal of Lark's common library duet knows, not '", n, "'"));
      }
      if (rules_.count(n)) continue;
      ASSIGN_OR_RETURN(rules_[n], RegexNode(it->second));
    }
    return absl::OkStatus();
  }

  int32_t NewNode(NodeKind kind) {
    Node n;
    n.kind = kind;
    g_.nodes.push_back(std::move(n));
    rule_of_.push_back(rule_);
    return static_cast<int32_t>(g_.nodes.size()) - 1;
  }

  // Whitespace and comments; newlines too unless `stop_at_newline`.
  void Skip(bool stop_at_newline = false) {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (lark_ ? t_.substr(pos_, 2) == "//" : c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (c == '\n' && stop_at_newline) {
        return;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        return;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '-' || t_[pos_] == '_')) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  // A rule's body ends where the next `name ::=` (Lark: `name:`, or a
  // directive) starts.
  bool AtRuleStart() {
    const size_t save = pos_;
    if (lark_ && pos_ < t_.size() && t_[pos_] == '%') return true;
    if (lark_ && pos_ < t_.size() && (t_[pos_] == '?' || t_[pos_] == '!')) ++pos_;
    const std::string name = Name();
    if (lark_ && pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    }
    Skip();
    const bool yes = !name.empty() && (lark_ ? pos_ < t_.size() && t_[pos_] == ':' && t_.substr(pos_, 2) != "::"
                                             : t_.substr(pos_, 3) == "::=");
    pos_ = save;
    return yes;
  }

  void SkipBody() {
    while (pos_ < t_.size()) {
      Skip();
      if (pos_ >= t_.size() || AtRuleStart()) return;
      const char c = t_[pos_];
      if (c == '"' || (c == '[' && !lark_) || (c == '/' && lark_)) {
        const char close = c == '"' ? '"' : c == '/' ? '/' : ']';
        for (++pos_; pos_ < t_.size() && t_[pos_] != close; ++pos_) {
          if (t_[pos_] == '\\') ++pos_;
        }
        ++pos_;
      } else {
        const size_t before = pos_;
        Name();
        if (pos_ == before) ++pos_;
      }
    }
  }

  absl::StatusOr<int32_t> Alternation(bool nested) {
    std::vector<int32_t> alts;
    ASSIGN_OR_RETURN(int32_t first, Sequence(nested));
    alts.push_back(first);
    while (true) {
      Skip();
      if (pos_ < t_.size() && t_[pos_] == '|') {
        ++pos_;
        ASSIGN_OR_RETURN(int32_t next, Sequence(nested));
        alts.push_back(next);
        continue;
      }
      break;
    }
    if (alts.size() == 1) return alts[0];
    const int32_t u = NewNode(NodeKind::kUnion);
    g_.nodes[u].alternatives = std::move(alts);
    return u;
  }

  absl::StatusOr<int32_t> Sequence(bool nested) {
    std::vector<int32_t> items;
    while (true) {
      Skip();
      if (pos_ >= t_.size() || t_[pos_] == '|' || (nested && (t_[pos_] == ')' || (lark_ && t_[pos_] == ']')))) break;
      if (!nested && AtRuleStart()) break;
      if (t_[pos_] == ')' || (lark_ && t_[pos_] == ']')) return Error(absl::StrCat("a term, not '", std::string(1, t_[pos_]), "'"));
      ASSIGN_OR_RETURN(int32_t item, Term());
      ASSIGN_OR_RETURN(item, Quantified(item));
      items.push_back(item);
    }
    if (items.size() == 1) return items[0];
    const int32_t s = NewNode(NodeKind::kSeq);  // empty: matches ""
    g_.nodes[s].sequence = std::move(items);
    return s;
  }

  // A decimal count at pos_ (capped at 100,000); false when there is none.
  bool Count(int64_t* out) {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
      v = std::min<int64_t>(v * 10 + (t_[pos_++] - '0'), 100000);
    }
    *out = v;
    return pos_ > start;
  }

  absl::StatusOr<int32_t> Quantified(int32_t item) {
    while (pos_ < t_.size()) {
      int64_t min = 0, max = -1;
      if (lark_) {  // Lark writes `item ~ n` with spaces
        size_t k = pos_;
        while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t')) ++k;
        if (k < t_.size() && t_[k] == '~') pos_ = k;
      }
      const char c = t_[pos_];
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1, ++pos_;
      } else if (c == '?') {
        max = 1, ++pos_;
      } else if (lark_ && c == '~') {  // ~ n, ~ n..m
        ++pos_;
        Skip();
        if (!Count(&min)) return Error("a count after '~'");
        max = min;
        if (t_.substr(pos_, 2) == "..") {
          pos_ += 2;
          if (!Count(&max)) return Error("a count after '..'");
        }
        if (max < min) return Error("~ n..m with m >= n");
      } else if (c == '{' && !lark_) {
        ++pos_;
        Skip();
        if (!Count(&min)) return Error("a count in {m,n}");
        Skip();
        max = min;
        if (pos_ < t_.size() && t_[pos_] == ',') {
          ++pos_;
          Skip();
          if (!Count(&max)) max = -1;
          Skip();
        }
        if (pos_ >= t_.size() || t_[pos_] != '}') return Error("'}'");
        ++pos_;
        if (max >= 0 && max < min) return Error("{m,n} with n >= m");
      } else {
        return item;
      }
      const int32_t r = NewNode(NodeKind::kRepeat);
      g_.nodes[r].repeat = item;
      g_.nodes[r].min_items = min;
      g_.nodes[r].max_items = max;
      item = r;
    }
    return item;
  }

  // A "literal" at pos_ (its escapes decoded), pos_ after its closing quote.
  absl::Status ReadLiteral(std::string* out) {
    std::string& lit = *out;
    ++pos_;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') return Error("a closing '\"'");
      if (t_[pos_] == '"') break;
      if (t_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= t_.size()) return Error("an escape");
        const char e = t_[pos_++];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits > 0) {
          uint32_t cp = 0;
          for (int k = 0; k < digits; ++k, ++pos_) {
            if (pos_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[pos_]))) return Error("hex digits");
            const char h = t_[pos_];
            cp = cp * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          uint8_t buf[4];
          const int n = EncodeUtf8(cp, buf);
          lit.append(reinterpret_cast<char*>(buf), n);
          continue;
        }
        switch (e) {
          case 'n': lit.push_back('\n'); break;
          case 't': lit.push_back('\t'); break;
          case 'r': lit.push_back('\r'); break;
          case '\\': lit.push_back('\\'); break;
          case '"': lit.push_back('"'); break;
          case '[': lit.push_back('['); break;
          case ']': lit.push_back(']'); break;
          default: --pos_; return Error("a known escape");
        }
        continue;
      }
      lit.push_back(t_[pos_++]);
    }
    ++pos_;
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Term() {
    const char c = t_[pos_];
    if (lark_ && c == '/') {  // /regex/ (no flags)
      std::string re;
      for (++pos_; pos_ < t_.size() && t_[pos_] != '/'; ++pos_) {
        if (t_[pos_] == '\n') return Error("a closing '/'");
        if (t_[pos_] == '\\' && pos_ + 1 < t_.size()) re.push_back(t_[pos_++]);
        re.push_back(t_[pos_]);
      }
      if (pos_ >= t_.size()) return Error("a closing '/'");
      ++pos_;
      if (pos_ < t_.size() && std::isalpha(static_cast<unsigned char>(t_[pos_]))) {
        return Refuse(absl::StrCat("regex flags ('", std::string(1, t_[pos_]), "') are not supported"));
      }
      return RegexNode(re);
    }
    if (lark_ && c == '[') {  // [optional]
      ++pos_;
      ASSIGN_OR_RETURN(int32_t inner, Alternation(/*nested=*/true));
      Skip();
      if (pos_ >= t_.size() || t_[pos_] != ']') return Error("']'");
      ++pos_;
      const int32_t r = NewNode(NodeKind::kRepeat);
      g_.nodes[r].repeat = inner;
      g_.nodes[r].min_items = 0;
      g_.nodes[r].max_items = 1;
      return r;
    }
    if (lark_ && (c == '.' || c == '{')) return Error(absl::StrCat("a term, not '", std::string(1, c), "'"));
    if (c == '"') {
      std::string lit;
      RETURN_IF_ERROR(ReadLiteral(&lit));
      if (lark_ && pos_ < t_.size() && t_[pos_] == 'i') return Refuse("a case-insensitive literal (\"...\"i) is not supported");
      if (lark_ && t_.substr(pos_, 2) == "..") {  // "a".."z"
        pos_ += 2;
        std::string hi;
        if (pos_ >= t_.size() || t_[pos_] != '"') return Error("a literal after '..'");
        RETURN_IF_ERROR(ReadLiteral(&hi));
        if (lit.size() != 1 || hi.size() != 1) return Refuse("a range of more than one byte per end is not supported");
        auto hex = [](char ch) { return absl::StrFormat("\\x%02x", static_cast<unsigned char>(ch)); };
        return RegexNode(absl::StrCat("[", hex(lit[0]), "-", hex(hi[0]), "]"));
      }
      const int32_t root = static_cast<int32_t>(g_.literals.size());
      g_.literals.emplace_back();
      g_.AddLiteral(root, lit);
      const int32_t n = NewNode(NodeKind::kLiteral);
      g_.nodes[n].literal = root;
      return n;
    }
    if (c == '[' || c == '.') {
      std::string cls;
      if (c == '.') {
        cls = "[\\s\\S]";
        ++pos_;
      } else {
        const size_t start = pos_;
        for (++pos_; pos_ < t_.size() && t_[pos_] != ']'; ++pos_) {
          if (t_[pos_] == '\\') ++pos_;
        }
        if (pos_ >= t_.size()) return Error("a closing ']'");
        ++pos_;
        cls = std::string(t_.substr(start, pos_ - start));
      }
      return RegexNode(cls);
    }
    if (c == '(') {
      ++pos_;
      ASSIGN_OR_RETURN(int32_t inner, Alternation(/*nested=*/true));
      Skip();
      if (pos_ >= t_.size() || t_[pos_] != ')') return Error("')'");
      ++pos_;
      return inner;
    }
    const size_t at = pos_;
    const std::string name = Name();
    if (name.empty()) return Error("a literal, a class, a group or a rule name");
    auto it = rules_.find(name);
    if (it == rules_.end()) {
      pos_ = at;
      return Error(absl::StrCat("a defined rule, not '", name, "'"));
    }
    return it->second;
  }

  // Whether `n` reaches itself before consuming a byte (DFS over the nodes
  // that may start it: union alternatives, a sequence's leading items up to
  // the first that cannot be empty, a repetition's item).
  bool LeftRecursive(int32_t n, std::vector<char>& color) {
    if (color[n] == 1) return true;
    if (color[n] == 2) return false;
    color[n] = 1;
    const Node& node = g_.nodes[n];
    std::vector<int32_t> next;
    if (node.kind == NodeKind::kUnion) next = node.alternatives;
    if (node.kind == NodeKind::kRepeat) next = {node.repeat};
    if (node.kind == NodeKind::kSeq) {
      for (int32_t item : node.sequence) {
        next.push_back(item);
        if (!g_.nullable[item]) break;
      }
    }
    for (int32_t m : next) {
      if (LeftRecursive(m, color)) return true;
    }
    color[n] = 2;
    return false;
  }

  std::string_view t_;
  Grammar& g_;
  const bool lark_;
  size_t pos_ = 0;
  std::string rule_;
  std::vector<std::string> rule_of_;
  std::map<std::string, int32_t> rules_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(std::string_view text, std::shared_ptr<const Vocabulary> vocab) {
  auto g = std::make_shared<Grammar>(std::move(vocab));
  GbnfCompiler c(text, *g, /*lark=*/false);
  RETURN_IF_ERROR(c.Compile());
  return g;
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileLark(std::string_view text, std::shared_ptr<const Vocabulary> vocab) {
  auto g = std::make_shared<Grammar>(std::move(vocab));
  GbnfCompiler c(text, *g, /*lark=*/true);
  RETURN_IF_ERROR(c.Compile());
  return g;
}

}  // namespace duet::grammar

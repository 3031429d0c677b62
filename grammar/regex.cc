#include "grammar/regex.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int kMaxNfaStates = 200000;
constexpr int kMaxDfaStates = 20000;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

Ranges Negate(const Ranges& r) {
  Ranges n = Normalize(r), out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : n) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

const Ranges& DigitRanges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& WordRanges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& SpaceRanges() {  // ECMA-262 WhiteSpace and LineTerminator
  static const Ranges r = Normalize({{'\t', '\r'},
                                     {' ', ' '},
                                     {0xA0, 0xA0},
                                     {0x1680, 0x1680},
                                     {0x2000, 0x200A},
                                     {0x2028, 0x2029},
                                     {0x202F, 0x202F},
                                     {0x205F, 0x205F},
                                     {0x3000, 0x3000},
                                     {0xFEFF, 0xFEFF}});
  return r;
}
const Ranges& DotRanges() {  // anything but a line terminator
  static const Ranges r = Negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return r;
}
const Ranges& AnyRanges() {
  static const Ranges r = {{0, kMaxCodepoint}};
  return r;
}

struct Ast {
  enum class Kind { kEmpty, kClass, kConcat, kAlt, kRepeat, kBol, kEol };
  Kind kind = Kind::kEmpty;
  Ranges ranges;
  std::vector<Ast> kids;
  int min = 0, max = 0;  // kRepeat; max -1 = unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view pattern) : p_(pattern) {}

  absl::StatusOr<Ast> Parse() {
    ASSIGN_OR_RETURN(Ast a, ParseAlt());
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    return a;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("pattern \"", std::string(p_), "\": ", std::string(what), " at offset ", pos_));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  // Decodes one UTF-8 character of the pattern.
  uint32_t TakeCodepoint() {
    const auto b = static_cast<uint8_t>(p_[pos_++]);
    int extra = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    uint32_t cp = extra == 0 ? b : b & (0x3F >> extra);
    for (; extra > 0 && pos_ < p_.size(); --extra) cp = (cp << 6) | (static_cast<uint8_t>(p_[pos_++]) & 0x3F);
    return cp;
  }

  absl::StatusOr<Ast> ParseAlt() {
    Ast alt;
    alt.kind = Ast::Kind::kAlt;
    ASSIGN_OR_RETURN(Ast first, ParseSeq());
    alt.kids.push_back(std::move(first));
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      ASSIGN_OR_RETURN(Ast next, ParseSeq());
      alt.kids.push_back(std::move(next));
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  absl::StatusOr<Ast> ParseSeq() {
    Ast seq;
    seq.kind = Ast::Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      ASSIGN_OR_RETURN(Ast atom, ParseAtom());
      ASSIGN_OR_RETURN(atom, ParseQuantifiers(std::move(atom)));
      seq.kids.push_back(std::move(atom));
    }
    return seq;
  }

  absl::StatusOr<Ast> ParseQuantifiers(Ast atom) {
    while (!AtEnd()) {
      int min = 0, max = -1;
      const char c = Peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1, ++pos_;
      } else if (c == '?') {
        max = 1, ++pos_;
      } else if (c == '{') {
        size_t save = pos_;
        ++pos_;
        auto number = [&](int* out) {
          size_t start = pos_;
          long long v = 0;
          while (!AtEnd() && Peek() >= '0' && Peek() <= '9') v = std::min(v * 10 + (p_[pos_++] - '0'), 100000LL);
          *out = static_cast<int>(v);
          return pos_ > start;
        };
        if (!number(&min)) {  // a literal '{', as ECMA-262's Annex B reads it
          pos_ = save;
          return atom;
        }
        max = min;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          if (!number(&max)) max = -1;
        }
        if (AtEnd() || Peek() != '}') {
          pos_ = save;
          return atom;
        }
        ++pos_;
        if (max >= 0 && max < min) return Error("quantifier {n,m} with m < n");
        if (min > 1000 || max > 1000) return Error("repetition count over 1000");
      } else {
        return atom;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
      if (atom.kind == Ast::Kind::kBol || atom.kind == Ast::Kind::kEol) return Error("quantified anchor");
      Ast rep;
      rep.kind = Ast::Kind::kRepeat;
      rep.min = min;
      rep.max = max;
      rep.kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  static Ast Class(Ranges r) {
    Ast a;
    a.kind = Ast::Kind::kClass;
    a.ranges = std::move(r);
    return a;
  }

  absl::StatusOr<Ast> ParseAtom() {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && Peek() == '?') {
        if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
          pos_ += 2;
        } else if (pos_ + 1 < p_.size() && p_[pos_ + 1] == '<' && pos_ + 2 < p_.size() && p_[pos_ + 2] != '=' &&
                   p_[pos_ + 2] != '!') {
          const size_t close = p_.find('>', pos_);  // a named group: the name is not matched
          if (close == std::string_view::npos) return Error("unterminated group name");
          pos_ = close + 1;
        } else {
          return Error("lookaround assertion (?...) is not supported");
        }
      }
      ASSIGN_OR_RETURN(Ast inner, ParseAlt());
      if (AtEnd() || Peek() != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Class(DotRanges());
    }
    if (c == '^' || c == '$') {
      ++pos_;
      Ast a;
      a.kind = c == '^' ? Ast::Kind::kBol : Ast::Kind::kEol;
      return a;
    }
    if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat");
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error("trailing backslash");
      Ranges r;
      RETURN_IF_ERROR(ParseEscape(/*in_class=*/false, &r));
      return Class(std::move(r));
    }
    const uint32_t cp = TakeCodepoint();
    return Class({{cp, cp}});
  }

  absl::Status ParseEscape(bool in_class, Ranges* out) {
    const char e = p_[pos_++];
    switch (e) {
      case 'd': *out = DigitRanges(); return absl::OkStatus();
      case 'D': *out = Negate(DigitRanges()); return absl::OkStatus();
      case 'w': *out = WordRanges(); return absl::OkStatus();
      case 'W': *out = Negate(WordRanges()); return absl::OkStatus();
      case 's': *out = SpaceRanges(); return absl::OkStatus();
      case 'S': *out = Negate(SpaceRanges()); return absl::OkStatus();
      case 'n': *out = {{'\n', '\n'}}; return absl::OkStatus();
      case 't': *out = {{'\t', '\t'}}; return absl::OkStatus();
      case 'r': *out = {{'\r', '\r'}}; return absl::OkStatus();
      case 'f': *out = {{'\f', '\f'}}; return absl::OkStatus();
      case 'v': *out = {{'\v', '\v'}}; return absl::OkStatus();
      case '0': *out = {{0, 0}}; return absl::OkStatus();
      case 'b':
        if (in_class) {
          *out = {{'\b', '\b'}};
          return absl::OkStatus();
        }
        --pos_;
        return Error("word boundary \\b is not supported");
      case 'B': --pos_; return Error("word boundary \\B is not supported");
      case 'c':
        if (!AtEnd() && std::isalpha(static_cast<unsigned char>(Peek()))) {
          const uint32_t v = static_cast<uint32_t>(p_[pos_++]) % 32;
          *out = {{v, v}};
          return absl::OkStatus();
        }
        *out = {{'\\', '\\'}, {'c', 'c'}};
        return absl::OkStatus();
      case 'x':
      case 'u': {
        uint32_t v = 0;
        int digits = e == 'x' ? 2 : 4;
        bool braces = e == 'u' && !AtEnd() && Peek() == '{';
        if (braces) {
          ++pos_;
          digits = 6;
        }
        int got = 0;
        while (got < digits && !AtEnd() && std::isxdigit(static_cast<unsigned char>(Peek()))) {
          const char h = p_[pos_++];
          v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
          ++got;
        }
        if (braces) {
          if (AtEnd() || Peek() != '}') return Error("malformed \\u{...}");
          ++pos_;
        } else if (got != digits) {
          pos_ -= got;  // Annex B: an identity escape
          *out = {{static_cast<uint32_t>(e), static_cast<uint32_t>(e)}};
          return absl::OkStatus();
        }
        if (v > kMaxCodepoint) return Error("code point out of range");
        *out = {{v, v}};
        return absl::OkStatus();
      }
      case 'p':
      case 'P': --pos_; return Error("Unicode property escape \\p is not supported");
      default:
        if (e >= '1' && e <= '9' && !in_class) {
          --pos_;
          return Error("backreference is not supported");
        }
        --pos_;
        {
          const uint32_t cp = TakeCodepoint();
          *out = {{cp, cp}};
        }
        return absl::OkStatus();
    }
  }

  absl::StatusOr<Ast> ParseClass() {
    ++pos_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']' && !first) break;
      if (Peek() == ']' && first) {  // ECMA-262: "[]" matches nothing, "[^]" anything
        break;
      }
      first = false;
      Ranges lo;
      bool single = true;
      if (Peek() == '\\') {
        ++pos_;
        if (AtEnd()) return Error("trailing backslash");
        RETURN_IF_ERROR(ParseEscape(/*in_class=*/true, &lo));
        single = lo.size() == 1 && lo[0].first == lo[0].second;
      } else {
        const uint32_t cp = TakeCodepoint();
        lo = {{cp, cp}};
      }
      if (single && pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi;
        if (Peek() == '\\') {
          ++pos_;
          if (AtEnd()) return Error("trailing backslash");
          RETURN_IF_ERROR(ParseEscape(/*in_class=*/true, &hi));
        } else {
          const uint32_t cp = TakeCodepoint();
          hi = {{cp, cp}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second) {
          r.insert(r.end(), lo.begin(), lo.end());
          r.push_back({'-', '-'});
          r.insert(r.end(), hi.begin(), hi.end());
          continue;
        }
        if (hi[0].first < lo[0].first) return Error("character class range out of order");
        r.push_back({lo[0].first, hi[0].first});
        continue;
      }
      r.insert(r.end(), lo.begin(), lo.end());
    }
    ++pos_;  // ']'
    r = Normalize(std::move(r));
    return Class(negate ? Negate(r) : r);
  }

  std::string_view p_;
  size_t pos_ = 0;
};

// Thompson NFA over bytes. Anchors are epsilon edges that the subset
// construction follows only at the string's start (kBol) or to decide
// acceptance at its end (kEol).
struct NfaState {
  std::vector<int32_t> eps, bol, eol;
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };
  std::vector<Edge> edges;
  int32_t tag = -1;
};

class Nfa {
 public:
  struct Frag {
    int32_t start, end;
  };

  int32_t NewState() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }
  std::vector<NfaState>& states() { return states_; }

  absl::StatusOr<Frag> Build(const Ast& a) {
    if (states_.size() > kMaxNfaStates) return absl::InvalidArgumentError("pattern too large (automaton over 200,000 states)");
    Frag f{NewState(), NewState()};
    switch (a.kind) {
      case Ast::Kind::kEmpty: states_[f.start].eps.push_back(f.end); break;
      case Ast::Kind::kBol: states_[f.start].bol.push_back(f.end); break;
      case Ast::Kind::kEol: states_[f.start].eol.push_back(f.end); break;
      case Ast::Kind::kClass: AddRanges(a.ranges, f.start, f.end); break;
      case Ast::Kind::kConcat: {
        int32_t cur = f.start;
        for (const Ast& k : a.kids) {
          ASSIGN_OR_RETURN(Frag kf, Build(k));
          states_[cur].eps.push_back(kf.start);
          cur = kf.end;
        }
        states_[cur].eps.push_back(f.end);
        break;
      }
      case Ast::Kind::kAlt:
        for (const Ast& k : a.kids) {
          ASSIGN_OR_RETURN(Frag kf, Build(k));
          states_[f.start].eps.push_back(kf.start);
          states_[kf.end].eps.push_back(f.end);
        }
        break;
      case Ast::Kind::kRepeat: {
        int32_t cur = f.start;
        for (int i = 0; i < a.min; ++i) {
          ASSIGN_OR_RETURN(Frag kf, Build(a.kids[0]));
          states_[cur].eps.push_back(kf.start);
          cur = kf.end;
        }
        if (a.max < 0) {
          ASSIGN_OR_RETURN(Frag kf, Build(a.kids[0]));
          states_[cur].eps.push_back(kf.start);
          states_[kf.end].eps.push_back(cur);
          states_[cur].eps.push_back(f.end);
        } else {
          for (int i = a.min; i < a.max; ++i) {
            ASSIGN_OR_RETURN(Frag kf, Build(a.kids[0]));
            states_[cur].eps.push_back(f.end);
            states_[cur].eps.push_back(kf.start);
            cur = kf.end;
          }
          states_[cur].eps.push_back(f.end);
        }
        break;
      }
    }
    return f;
  }

  // Edges for the UTF-8 encodings of code points in `ranges` (surrogates excluded).
  void AddRanges(const Ranges& ranges, int32_t from, int32_t to) {
    for (auto [lo, hi] : ranges) {
      for (const auto& [a, b] : std::initializer_list<std::pair<uint32_t, uint32_t>>{
               {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, kMaxCodepoint}}) {
        const uint32_t l = std::max(lo, a), h = std::min(hi, b);
        if (l <= h) AddUtf8Range(l, h, from, to);
      }
    }
  }

  void AddLiteral(std::string_view bytes, int32_t from, int32_t to) {
    int32_t cur = from;
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int32_t next = i + 1 == bytes.size() ? to : NewState();
      const auto b = static_cast<uint8_t>(bytes[i]);
      states_[cur].edges.push_back({b, b, next});
      cur = next;
    }
    if (bytes.empty()) states_[from].eps.push_back(to);
  }

 private:
  static int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }


  // lo and hi have the same encoded length. Splits until every byte position
  // spans a plain range, then chains the byte ranges.
  void AddUtf8Range(uint32_t lo, uint32_t hi, int32_t from, int32_t to) {
    const int n = Utf8Length(lo);
    for (int i = 1; i < n; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          AddUtf8Range(lo, lo | m, from, to);
          AddUtf8Range((lo | m) + 1, hi, from, to);
          return;
        }
        if ((hi & m) != m) {
          AddUtf8Range(lo, (hi & ~m) - 1, from, to);
          AddUtf8Range(hi & ~m, hi, from, to);
          return;
        }
      }
    }
    uint8_t a[4], b[4];
    EncodeUtf8(lo, a);
    EncodeUtf8(hi, b);
    int32_t cur = from;
    for (int i = 0; i < n; ++i) {
      const int32_t next = i + 1 == n ? to : NewState();
      states_[cur].edges.push_back({a[i], b[i], next});
      cur = next;
    }
  }

  std::vector<NfaState> states_;
};

}  // namespace

class DfaBuilder {
 public:
  static absl::StatusOr<ByteDfa> Build(Nfa& nfa, int32_t start, int32_t num_tags) {
    std::vector<NfaState>& st = nfa.states();
    ByteDfa d;
    d.num_tags_ = num_tags;
    // Byte classes: bytes no edge tells apart share a class.
    std::array<bool, 257> cut{};
    for (const NfaState& s : st) {
      for (const auto& e : s.edges) {
        cut[e.lo] = true;
        cut[e.hi + 1] = true;
      }
    }
    std::array<uint8_t, 256> rep{};
    int classes = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[b]) ++classes;
      d.class_of_[b] = static_cast<uint8_t>(classes);
      rep[classes] = static_cast<uint8_t>(b);
    }
    d.num_classes_ = classes + 1;

    std::vector<char> seen(st.size(), 0);
    std::vector<int32_t> work;
    auto closure = [&](std::vector<int32_t>& set, bool at_start, bool at_end) {
      std::fill(seen.begin(), seen.end(), 0);
      work = set;
      for (int32_t s : set) seen[s] = 1;
      while (!work.empty()) {
        const int32_t s = work.back();
        work.pop_back();
        auto follow = [&](const std::vector<int32_t>& targets) {
          for (int32_t t : targets) {
            if (!seen[t]) {
              seen[t] = 1;
              set.push_back(t);
              work.push_back(t);
            }
          }
        };
        follow(st[s].eps);
        if (at_start) follow(st[s].bol);
        if (at_end) follow(st[s].eol);
      }
      std::sort(set.begin(), set.end());
    };

    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    std::vector<int32_t> init = {start};
    closure(init, /*at_start=*/true, /*at_end=*/false);
    ids[init] = 0;
    sets.push_back(init);
    for (size_t i = 0; i < sets.size(); ++i) {
      for (int c = 0; c < d.num_classes_; ++c) {
        std::vector<int32_t> next;
        const uint8_t b = rep[c];
        for (int32_t s : sets[i]) {
          for (const auto& e : st[s].edges) {
            if (e.lo <= b && b <= e.hi) next.push_back(e.to);
          }
        }
        int32_t id = ByteDfa::kDead;
        if (!next.empty()) {
          closure(next, false, false);
          auto [it, inserted] = ids.emplace(next, static_cast<int32_t>(sets.size()));
          if (inserted) {
            if (sets.size() >= kMaxDfaStates) {
              return absl::InvalidArgumentError("pattern too complex (automaton over 20,000 states)");
            }
            sets.push_back(std::move(next));
          }
          id = it->second;
        }
        d.next_.push_back(id);
      }
    }
    d.num_states_ = static_cast<int32_t>(sets.size());
    d.tag_begin_.push_back(0);
    for (const auto& s : sets) {
      std::vector<int32_t> end = s;
      closure(end, false, true);
      std::vector<int32_t> tags;
      for (int32_t n : end) {
        if (st[n].tag >= 0) tags.push_back(st[n].tag);
      }
      std::sort(tags.begin(), tags.end());
      tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
      d.tags_.insert(d.tags_.end(), tags.begin(), tags.end());
      d.tag_begin_.push_back(static_cast<int32_t>(d.tags_.size()));
    }
    // Tags reachable from each state (a fixpoint over the transitions), then
    // states that reach none become dead so a walk stops at the first byte
    // no match can follow.
    d.reach_words_ = (num_tags + 63) / 64;
    const size_t w = d.reach_words_;
    d.reach_.assign(static_cast<size_t>(d.num_states_) * w, 0);
    for (int32_t s = 0; s < d.num_states_; ++s) {
      for (int32_t t : d.Tags(s)) d.reach_[s * w + t / 64] |= uint64_t{1} << (t % 64);
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t s = d.num_states_ - 1; s >= 0; --s) {
        for (int c = 0; c < d.num_classes_; ++c) {
          const int32_t t = d.next_[s * d.num_classes_ + c];
          if (t < 0) continue;
          for (size_t k = 0; k < w; ++k) {
            const uint64_t m = d.reach_[s * w + k] | d.reach_[t * w + k];
            if (m != d.reach_[s * w + k]) {
              d.reach_[s * w + k] = m;
              changed = true;
            }
          }
        }
      }
    }
    for (int32_t& t : d.next_) {
      if (t < 0) continue;
      bool any = false;
      for (size_t k = 0; k < w; ++k) any |= d.reach_[t * w + k] != 0;
      if (!any) t = ByteDfa::kDead;
    }
    return d;
  }
};

int EncodeUtf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | cp);
  return n;
}

bool ByteDfa::Matches(std::string_view s) const {
  int32_t st = start();
  for (char c : s) {
    st = Next(st, static_cast<uint8_t>(c));
    if (st == kDead) return false;
  }
  return Accepting(st);
}

bool ByteDfa::CanReachTag(int32_t state, int32_t lo, int32_t hi) const {
  if (lo > hi) return false;
  const uint64_t* r = reach_.data() + static_cast<size_t>(state) * reach_words_;
  for (int32_t wi = lo / 64; wi <= hi / 64; ++wi) {
    uint64_t m = r[wi];
    if (wi == lo / 64) m &= ~uint64_t{0} << (lo % 64);
    if (wi == hi / 64 && hi % 64 != 63) m &= (uint64_t{1} << (hi % 64 + 1)) - 1;
    if (m != 0) return true;
  }
  return false;
}

namespace {

// Adds `pattern` with search semantics between from and to: anything may
// come before and after it unless an anchor says otherwise.
absl::Status AddPattern(Nfa& nfa, std::string_view pattern, int32_t from, int32_t to) {
  ASSIGN_OR_RETURN(Ast ast, Parser(pattern).Parse());
  ASSIGN_OR_RETURN(Nfa::Frag f, nfa.Build(ast));
  const int32_t pre = nfa.NewState(), post = nfa.NewState();
  nfa.states()[from].eps.push_back(pre);
  nfa.AddRanges(AnyRanges(), pre, pre);
  nfa.states()[pre].eps.push_back(f.start);
  nfa.states()[f.end].eps.push_back(post);
  nfa.AddRanges(AnyRanges(), post, post);
  nfa.states()[post].eps.push_back(to);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ByteDfa> CompileAlternatives(absl::Span<const DfaAlternative> alternatives) {
  Nfa nfa;
  const int32_t start = nfa.NewState();
  int32_t num_tags = 0;
  for (const DfaAlternative& a : alternatives) {
    const int32_t accept = nfa.NewState();
    switch (a.kind) {
      case DfaAlternative::Kind::kPattern: RETURN_IF_ERROR(AddPattern(nfa, a.text, start, accept)); break;
      case DfaAlternative::Kind::kLiteral: nfa.AddLiteral(a.text, start, accept); break;
      case DfaAlternative::Kind::kAnything: {
        const int32_t loop = nfa.NewState();
        nfa.states()[start].eps.push_back(loop);
        nfa.AddRanges(AnyRanges(), loop, loop);
        nfa.states()[loop].eps.push_back(accept);
        break;
      }
    }
    nfa.states()[accept].tag = a.tag;
    num_tags = std::max(num_tags, a.tag + 1);
  }
  return DfaBuilder::Build(nfa, start, num_tags);
}

absl::StatusOr<ByteDfa> CompileRegex(std::string_view pattern) {
  const DfaAlternative a{DfaAlternative::Kind::kPattern, std::string(pattern), 0};
  return CompileAlternatives({&a, 1});
}

}  // namespace duet::grammar

#include "grammar/matcher.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace duet::grammar {
namespace {

// Number phases.
enum : int32_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumE,
  kNumESign,
  kNumExp,
};
// Number flags (Frame::b): sign, exponent sign; digits kept in the mantissa above bit 8.
constexpr int32_t kNegative = 1, kExpNegative = 2;
constexpr int32_t kMaxMantissaDigits = 18;

// Object phases (Frame::a).
enum : int32_t { kObjOpen, kObjComma, kObjKey, kObjColon, kObjValue, kObjAfter };
// Array phases.
enum : int32_t { kArrOpen, kArrComma, kArrAfter };

int HexValue(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}


}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  tops_.push_back(kStart);
  steps_.push_back({0, 1, 0, false});
}

void Matcher::StartValue(int32_t node, int32_t below, uint8_t c, std::vector<int32_t>& out) {
  const Node& n = g_->nodes[node];
  switch (n.kind) {
    case NodeKind::kUnion:
      for (int32_t alt : n.alternatives) StartValue(alt, below, c, out);
      return;
    case NodeKind::kOneOf:
      // A marker under each alternative's value: when values complete,
      // ResolveOneOf lets one through only if a single alternative matched.
      for (size_t i = 0; i < n.alternatives.size(); ++i) {
        StartValue(n.alternatives[i], Push({node, below, static_cast<int32_t>(i), -1, 0, 0, 0}), c, out);
      }
      return;
    case NodeKind::kLiteral: {
      const int32_t child = g_->LiteralChild(n.literal, c);
      if (child >= 0) out.push_back(Push({node, below, child, 0, 0, 0, 0}));
      if (g_->literals[n.literal].terminal) FeedBelow(below, c, out);  // "" (GBNF, choices)
      return;
    }
    case NodeKind::kSeq:
      StartSeq(node, n, below, 0, c, out);
      return;
    case NodeKind::kRepeat:
      StartRepeat(node, n, below, 0, c, out);
      return;
    case NodeKind::kString:
      if (c == '"') out.push_back(Push({node, below, 0, 0, 0, 0, 0}));
      return;
    case NodeKind::kNumber:
      StepNumber({node, below, kNumStart, 0, 0, 0, 0}, n, c, out);
      return;
    case NodeKind::kObject:
      if (c == '{') out.push_back(Push({node, below, kObjOpen, 0, 0, -1, 0}));
      return;
    case NodeKind::kArray:
      if (c == '[') out.push_back(Push({node, below, kArrOpen, 0, 0, 0, 0}));
      return;
    case NodeKind::kRaw: {
      const ByteDfa& d = *g_->dfas[n.dfa];
      const int32_t t = d.Next(d.start(), c);
      if (t != ByteDfa::kDead) out.push_back(Push({node, below, t, 0, 0, 0, 0}));
      if (d.Accepting(d.start())) FeedBelow(below, c, out);
      return;
    }
    case NodeKind::kKey:
      return;
  }
}

void Matcher::StartSeq(int32_t node, const Node& n, int32_t below, int32_t from, uint8_t c, std::vector<int32_t>& out) {
  for (size_t j = from; j < n.sequence.size(); ++j) {
    StartValue(n.sequence[j], Push({node, below, static_cast<int32_t>(j) + 1, 0, 0, 0, 0}), c, out);
    if (!g_->nullable[n.sequence[j]]) return;
  }
  FeedBelow(below, c, out);  // the rest may be empty: the byte is what follows
}

void Matcher::StartRepeat(int32_t node, const Node& n, int32_t below, int32_t count, uint8_t c,
                          std::vector<int32_t>& out) {
  if (n.max_items < 0 || count < n.max_items) StartValue(n.repeat, Push({node, below, count + 1, 0, 0, 0, 0}), c, out);
  if (count >= n.min_items) FeedBelow(below, c, out);
}

void Matcher::Feed(int32_t top, uint8_t c, std::vector<int32_t>& out) {
  if (top == kStart) {
    StartValue(g_->root, kDone, c, out);
    return;
  }
  if (top == kDone) return;
  const Frame f = pool_[top];
  const Node& n = g_->nodes[f.node];
  switch (n.kind) {
    case NodeKind::kLiteral: {
      const int32_t child = g_->LiteralChild(f.a, c);
      if (child >= 0) {
        Frame nf = f;
        nf.a = child;
        out.push_back(Push(nf));
      }
      if (g_->literals[f.a].terminal) FeedBelow(f.below, c, out);
      return;
    }
    case NodeKind::kString:
    case NodeKind::kKey: StepString(f, n, c, out); return;
    case NodeKind::kNumber: StepNumber(f, n, c, out); return;
    case NodeKind::kObject: StepObject(f, n, c, out); return;
    case NodeKind::kArray: StepArray(f, n, c, out); return;
    case NodeKind::kOneOf: {  // the value above ended at this byte, which is the parent's
      Frame done = f;
      done.b = c;
      out.push_back(Push(done));
      return;
    }
    case NodeKind::kRaw: {
      const ByteDfa& d = *g_->dfas[n.dfa];
      const int32_t t = d.Next(f.a, c);
      if (t != ByteDfa::kDead) {
        Frame nf = f;
        nf.a = t;
        out.push_back(Push(nf));
      }
      if (d.Accepting(f.a)) FeedBelow(f.below, c, out);  // it may end here, the byte the parent's
      return;
    }
    case NodeKind::kSeq: StartSeq(f.node, n, f.below, f.a, c, out); return;
    case NodeKind::kRepeat: StartRepeat(f.node, n, f.below, f.a, c, out); return;
    case NodeKind::kUnion: return;
  }
}

void Matcher::ResolveOneOf(std::vector<int32_t>& out, size_t first) {
  auto is_marker = [&](int32_t top) { return top >= 0 && g_->nodes[pool_[top].node].kind == NodeKind::kOneOf; };
  while (true) {
    markers_.clear();
    size_t kept = first;
    for (size_t i = first; i < out.size(); ++i) {
      if (is_marker(out[i])) {
        markers_.push_back(out[i]);
      } else {
        out[kept++] = out[i];
      }
    }
    out.resize(kept);
    if (markers_.empty()) return;
    for (size_t i = 0; i < markers_.size(); ++i) {
      const Frame m = pool_[markers_[i]];
      bool alone = true;  // no other alternative of this oneOf completed the value
      for (size_t j = 0; j < markers_.size() && alone; ++j) {
        const Frame& o = pool_[markers_[j]];
        alone = !(o.node == m.node && o.below == m.below && o.a != m.a);
      }
      if (!alone) continue;
      if (m.b < 0) {
        out.push_back(m.below);
      } else {
        FeedBelow(m.below, static_cast<uint8_t>(m.b), out);
      }
    }
  }
}

// Runs one decoded byte of a string's content through its DFA.
bool Matcher::StringByte(Frame& f, const Node& n, uint8_t byte) {
  if (n.dfa < 0) return true;
  const ByteDfa& dfa = *g_->dfas[n.dfa];
  f.c = dfa.Next(f.c, byte);
  if (f.c == ByteDfa::kDead) return false;
  return n.kind != NodeKind::kKey || KeyAlive(f, n);
}

// A code point that came from an escape.
bool Matcher::StringChar(Frame& f, const Node& n, uint32_t cp) {
  if (n.max_length >= 0 && f.d >= n.max_length) return false;
  ++f.d;
  uint8_t buf[4];
  const int len = EncodeUtf8(cp, buf);
  for (int i = 0; i < len; ++i) {
    if (!StringByte(f, n, buf[i])) return false;
  }
  return true;
}

bool Matcher::EscapeViable(const Frame& f, const Node& n, uint32_t lo, uint32_t hi) {
  for (uint32_t cp = lo; cp <= hi; ++cp) {
    Frame t = f;
    if (StringChar(t, n, cp)) return true;
  }
  return false;
}

bool Matcher::KeyAlive(const Frame& f, const Node& n) const {
  const ByteDfa& dfa = *g_->dfas[n.dfa];
  const Frame& obj = pool_[f.below];
  const Node& on = g_->nodes[n.object];
  const int32_t np = static_cast<int32_t>(on.props.size());
  const int32_t pos = obj.b, next_required = on.next_required[pos];
  if (dfa.CanReachTag(f.c, pos, std::min(next_required, np - 1))) return true;
  return next_required == np && dfa.CanReachTag(f.c, np, dfa.num_tags() - 1);
}

void Matcher::StepString(const Frame& f, const Node& n, uint8_t c, std::vector<int32_t>& out) {
  Frame nf = f;
  switch (f.a) {
    case 0:
      if (c == '"') {
        if (f.b != 0 || f.d < n.min_length) return;
        if (n.kind == NodeKind::kKey) {
          CloseKey(f, n, out);
          return;
        }
        if (n.dfa >= 0 && !g_->dfas[n.dfa]->Accepting(f.c)) return;
        out.push_back(f.below);
        return;
      }
      if (c == '\\') {
        if (f.b != 0 || (n.max_length >= 0 && f.d >= n.max_length)) return;  // an escape is one more character
        nf.a = 1;
        if (n.dfa >= 0 && !EscapeViable(nf, n, 0, 0x7F)) return;  // every escape names an ASCII character
        out.push_back(Push(nf));
        return;
      }
      {
        bool starts;
        const int32_t p = Utf8Step(f.b, c, &starts);
        if (p < 0 || c < 0x20) return;
        if (starts) {
          if (n.max_length >= 0 && f.d >= n.max_length) return;
          ++nf.d;
        }
        nf.b = p;
        if (!StringByte(nf, n, c)) return;
        out.push_back(Push(nf));
      }
      return;
    case 1: {
      uint32_t cp;
      switch (c) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
          nf.a = 2;
          nf.v = 0;
          if (n.dfa >= 0 && !EscapeViable(nf, n, 0, 0x7F)) return;
          out.push_back(Push(nf));
          return;
        default: return;
      }
      nf.a = 0;
      if (StringChar(nf, n, cp)) out.push_back(Push(nf));
      return;
    }
    default: {  // \u and (a - 2) hex digits
      const int h = HexValue(c);
      if (h < 0) return;
      nf.v = nf.v * 16 + h;
      if (f.a < 5) {
        ++nf.a;
        // Under a pattern (or a key's names) a \u escape is an ASCII
        // character's, \u0000-\u007f (what compact JSON escapes), taken only
        // while one of the characters it can still name fits: the mask never
        // leads into an escape that no digits can finish.
        if (n.dfa >= 0) {
          const int64_t span = int64_t{1} << (4 * (6 - nf.a));
          const int64_t lo = nf.v * span, hi = lo + span - 1;
          if (lo > 0x7F || !EscapeViable(nf, n, static_cast<uint32_t>(lo), static_cast<uint32_t>(std::min<int64_t>(hi, 0x7F)))) {
            return;
          }
        }
        out.push_back(Push(nf));
        return;
      }
      nf.a = 0;
      if (StringChar(nf, n, static_cast<uint32_t>(nf.v))) out.push_back(Push(nf));
      return;
    }
  }
}

void Matcher::CloseKey(const Frame& f, const Node& n, std::vector<int32_t>& out) {
  const ByteDfa& dfa = *g_->dfas[n.dfa];
  Frame obj = pool_[f.below];
  const Node& on = g_->nodes[n.object];
  const int32_t np = static_cast<int32_t>(on.props.size());
  const int32_t pos = obj.b, next_required = on.next_required[pos];
  if (on.max_properties >= 0 && obj.c >= on.max_properties) return;
  int32_t value = -1, new_pos = np;
  bool named = false;
  for (int32_t t : dfa.Tags(f.c)) {
    if (t < np) {
      named = true;
      if (t < pos || t > next_required) return;  // repeated, or skips a required one
      value = on.props[t].node;
      new_pos = t + 1;
      break;
    }
  }
  if (!named) {
    if (next_required != np) return;
    for (int32_t t : dfa.Tags(f.c)) {
      if (t >= np && t < np + static_cast<int32_t>(on.pattern_nodes.size())) {
        value = on.pattern_nodes[t - np];
        break;
      }
    }
    if (value < 0 && n.open) value = on.additional;
    if (value < 0) return;
  }
  obj.a = kObjColon;
  obj.b = new_pos;
  obj.c += 1;
  obj.d = value;
  out.push_back(Push(obj));
}

bool Matcher::Whitespace(const Frame& f, uint8_t c, std::vector<int32_t>& out) {
  if (g_->max_whitespace == 0 || !(c == ' ' || c == '\n' || c == '\t' || c == '\r')) return false;
  if (f.v < g_->max_whitespace) {
    Frame nf = f;
    ++nf.v;
    out.push_back(Push(nf));
  }
  return true;
}

void Matcher::StepObject(const Frame& f, const Node& n, uint8_t c, std::vector<int32_t>& out) {
  if (f.a != kObjKey && Whitespace(f, c, out)) return;
  const int32_t np = static_cast<int32_t>(n.props.size());
  Frame nf = f;
  nf.v = 0;  // the whitespace run ends
  switch (f.a) {
    case kObjOpen:
    case kObjComma:
      if (c == '"') {
        nf.a = kObjKey;
        const int32_t obj = Push(nf);
        out.push_back(Push({n.key, obj, 0, 0, 0, 0, 0}));
      } else if (c == '}' && f.a == kObjOpen && n.next_required[f.b] == np && f.c >= n.min_properties) {
        out.push_back(f.below);
      }
      return;
    case kObjColon:
      if (c == ':') {
        nf.a = kObjValue;
        out.push_back(Push(nf));
      }
      return;
    case kObjValue: {
      nf.a = kObjAfter;
      StartValue(f.d, Push(nf), c, out);
      return;
    }
    case kObjAfter:
      if (c == ',') {
        if (n.max_properties >= 0 && f.c >= n.max_properties) return;
        if (f.b >= np && n.additional < 0 && n.pattern_nodes.empty()) return;
        nf.a = kObjComma;
        out.push_back(Push(nf));
      } else if (c == '}' && n.next_required[f.b] == np && f.c >= n.min_properties) {
        out.push_back(f.below);
      }
      return;
    default: return;
  }
}

void Matcher::StepArray(const Frame& f, const Node& n, uint8_t c, std::vector<int32_t>& out) {
  if (Whitespace(f, c, out)) return;
  auto item_node = [&](int64_t i) {
    return i < static_cast<int64_t>(n.prefix.size()) ? n.prefix[i] : n.items;
  };
  Frame nf = f;
  nf.v = 0;
  switch (f.a) {
    case kArrOpen:
      if (c == ']') {
        if (n.min_items == 0) out.push_back(f.below);
        return;
      }
      [[fallthrough]];
    case kArrComma: {
      const int32_t item = item_node(f.b);
      if (item < 0 || (n.max_items >= 0 && f.b >= n.max_items)) return;
      nf.a = kArrAfter;
      nf.b = f.b + 1;
      StartValue(item, Push(nf), c, out);
      return;
    }
    case kArrAfter:
      if (c == ',') {
        if (item_node(f.b) < 0 || (n.max_items >= 0 && f.b >= n.max_items)) return;
        nf.a = kArrComma;
        out.push_back(Push(nf));
      } else if (c == ']' && f.b >= n.min_items) {
        out.push_back(f.below);
      }
      return;
    default: return;
  }
}

void Matcher::StepNumber(Frame f, const Node& n, uint8_t c, std::vector<int32_t>& out) {
  const bool digit = c >= '0' && c <= '9';
  int32_t kept = f.b >> 8;
  auto add_digit = [&](bool fraction) {
    if (f.v == 0 && c == '0') {
      if (fraction) --f.c;  // a leading zero of the fraction scales what follows
      return;
    }
    if (kept < kMaxMantissaDigits) {
      f.v = f.v * 10 + (c - '0');
      ++kept;
      if (fraction) --f.c;
    } else if (!fraction) {
      ++f.c;  // a dropped integer digit
    }
  };
  int32_t next = -1;
  switch (f.a) {
    case kNumStart:
      if (c == '-') {
        f.b |= kNegative;
        next = kNumMinus;
      } else if (c == '0') {
        next = kNumZero;
      } else if (digit) {
        add_digit(false);
        next = kNumInt;
      }
      break;
    case kNumMinus:
      if (c == '0') {
        next = kNumZero;
      } else if (digit) {
        add_digit(false);
        next = kNumInt;
      }
      break;
    case kNumZero:
    case kNumInt:
      if (digit && f.a == kNumInt) {
        add_digit(false);
        next = kNumInt;
      } else if (c == '.' && !n.integer) {
        next = kNumDot;
      } else if ((c == 'e' || c == 'E') && !n.integer) {
        next = kNumE;
      }
      break;
    case kNumDot:
    case kNumFrac:
      if (digit) {
        add_digit(true);
        next = kNumFrac;
      } else if ((c == 'e' || c == 'E') && f.a == kNumFrac) {
        next = kNumE;
      }
      break;
    case kNumE:
      if (c == '+' || c == '-') {
        if (c == '-') f.b |= kExpNegative;
        next = kNumESign;
        break;
      }
      [[fallthrough]];
    case kNumESign:
    case kNumExp:
      if (digit) {
        f.d = std::min(f.d * 10 + (c - '0'), 100000);
        next = kNumExp;
      }
      break;
  }
  if (next >= 0) {
    f.a = next;
    f.b = (f.b & 0xFF) | (kept << 8);
    if (n.integer && (n.has_minimum || n.has_maximum) && !IntegerAlive(f, n)) return;
    out.push_back(Push(f));
    return;
  }
  if (f.a == kNumStart) return;
  // The byte is not the number's: it ends here, and the byte is the parent's.
  if (NumberComplete(f, n)) FeedBelow(f.below, c, out);
}

namespace {

double NumberValue(int64_t mantissa, int32_t scale, int32_t flags, int32_t exp) {
  if (mantissa == 0) return 0.0;
  char buf[64];
  const int64_t e = static_cast<int64_t>(scale) + ((flags & kExpNegative) ? -exp : exp);
  std::snprintf(buf, sizeof(buf), "%s%llde%lld", (flags & kNegative) ? "-" : "", static_cast<long long>(mantissa),
                static_cast<long long>(e));
  return std::strtod(buf, nullptr);
}

}  // namespace

bool Matcher::NumberComplete(const Frame& f, const Node& n) const {
  if (f.a != kNumZero && f.a != kNumInt && f.a != kNumFrac && f.a != kNumExp) return false;
  if (!n.has_minimum && !n.has_maximum && n.multiple_of == 0) return true;
  const double x = NumberValue(f.v, f.c, f.b, f.d);
  if (n.has_minimum && (x < n.minimum || (n.exclusive_minimum && x == n.minimum))) return false;
  if (n.has_maximum && (x > n.maximum || (n.exclusive_maximum && x == n.maximum))) return false;
  if (n.multiple_of != 0) {
    const double m = n.multiple_of;
    if (m == std::floor(m) && x == std::floor(x) && std::fabs(x) < 9e15 && m < 9e15) {
      return std::fmod(x, m) == 0;
    }
    const double q = x / m;
    if (!std::isfinite(q)) return false;
    return q == std::floor(q);
  }
  return true;
}

// Whether an integer that starts with the digits so far can still land in
// its bounds (it can grow by more digits).
bool Matcher::IntegerAlive(const Frame& f, const Node& n) const {
  const bool negative = f.b & kNegative;
  if (f.a == kNumStart) return true;
  const long double lo = n.has_minimum ? (n.exclusive_minimum ? std::floor(n.minimum) + 1 : std::ceil(n.minimum)) : -1e300L;
  const long double hi = n.has_maximum ? (n.exclusive_maximum ? std::ceil(n.maximum) - 1 : std::floor(n.maximum)) : 1e300L;
  if (f.a == kNumMinus) return lo <= std::min(hi, -1.0L);
  if (f.a == kNumZero) return lo <= 0 && 0 <= hi;
  long double p = static_cast<long double>(f.v);
  for (int i = 0; i < f.c; ++i) p *= 10;
  long double scale = 1;
  for (int k = 0; k < 30; ++k, p *= 10, scale *= 10) {
    long double a = p, b = p + scale - 1;
    if (negative) {
      const long double t = -b;
      b = -a;
      a = t;
    }
    if (b >= lo && a <= hi) return true;
    if (!negative && a > hi) return false;
    if (negative && b < lo) return false;
  }
  return false;
}

bool Matcher::SameStack(int32_t a, int32_t b) const {
  while (a != b) {
    if (a < 0 || b < 0) return false;
    const Frame& x = pool_[a];
    const Frame& y = pool_[b];
    if (x.node != y.node || x.a != y.a || x.b != y.b || x.c != y.c || x.d != y.d || x.v != y.v) return false;
    a = x.below;
    b = y.below;
  }
  return true;
}

void Matcher::Advance(const std::vector<int32_t>& in, size_t begin, size_t end, uint8_t byte,
                      std::vector<int32_t>& out) {
  const size_t first = out.size();
  for (size_t i = begin; i < end; ++i) Feed(in[i], byte, out);
  if (g_->has_one_of) ResolveOneOf(out, first);
  if (out.size() - first > 1) {
    size_t kept = first;
    for (size_t i = first; i < out.size(); ++i) {
      bool dup = false;
      for (size_t j = first; j < kept && !dup; ++j) dup = SameStack(out[i], out[j]);
      if (!dup) out[kept++] = out[i];
    }
    out.resize(kept);
  }
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  const Step cur = steps_.back();
  if (cur.ended) return false;
  const size_t pool_mark = pool_.size();
  scratch_a_.assign(tops_.begin() + cur.tops_begin, tops_.begin() + cur.tops_end);
  for (char ch : bytes) {
    scratch_b_.clear();
    Advance(scratch_a_, 0, scratch_a_.size(), static_cast<uint8_t>(ch), scratch_b_);
    if (scratch_b_.empty()) {
      pool_.resize(pool_mark);
      return false;
    }
    scratch_a_.swap(scratch_b_);
  }
  const int32_t begin = static_cast<int32_t>(tops_.size());
  tops_.insert(tops_.end(), scratch_a_.begin(), scratch_a_.end());
  steps_.push_back({begin, static_cast<int32_t>(tops_.size()), pool_mark, false});
  return true;
}

bool Matcher::AcceptToken(int32_t id) {
  const Vocabulary& vocab = g_->vocab();
  if (id < 0 || id >= vocab.size()) return false;
  for (int32_t eos : vocab.eos_ids()) {
    if (id == eos) {
      if (!CanEnd() || steps_.back().ended) return false;
      Step s = steps_.back();
      s.pool_size = pool_.size();
      s.ended = true;
      steps_.push_back(s);
      return true;
    }
  }
  const std::string_view b = vocab.bytes(id);
  return !b.empty() && AcceptBytes(b);
}

void Matcher::Rollback(int32_t n) {
  n = std::min(n, steps());
  if (n <= 0) return;
  const Step& back_to = steps_[steps_.size() - n];
  pool_.resize(back_to.pool_size);
  tops_.resize(back_to.tops_begin);
  steps_.resize(steps_.size() - n);
}

bool Matcher::StackCanEnd(int32_t top) const {
  if (top == kDone) return true;
  if (top == kStart) return g_->nullable[g_->root];  // an empty output
  // Every frame down to the bottom can finish without more input.
  for (int32_t x = top; x != kDone; x = pool_[x].below) {
    if (x < 0) return false;
    const Frame& f = pool_[x];
    const Node& n = g_->nodes[f.node];
    bool finishes = false;
    switch (n.kind) {
      case NodeKind::kLiteral: finishes = g_->literals[f.a].terminal; break;
      case NodeKind::kNumber: finishes = NumberComplete(f, n); break;
      case NodeKind::kRaw: finishes = g_->dfas[n.dfa]->Accepting(f.a); break;
      case NodeKind::kOneOf: finishes = true; break;
      case NodeKind::kSeq:
        finishes = true;
        for (size_t j = f.a; j < n.sequence.size(); ++j) finishes = finishes && g_->nullable[n.sequence[j]];
        break;
      case NodeKind::kRepeat: finishes = f.a >= n.min_items; break;
      default: break;
    }
    if (!finishes) return false;
  }
  return true;
}

bool Matcher::CanEnd() const {
  const Step& s = steps_.back();
  if (s.ended) return false;
  // A scalar root value ends with the input: no byte comes to resolve its
  // oneOf markers, so a stack counts unless another ending stack completed
  // the same oneOf in another alternative.
  auto conflicts = [&](int32_t a, int32_t b) {
    for (int32_t x = a; x >= 0; x = pool_[x].below) {
      const Frame& fx = pool_[x];
      if (g_->nodes[fx.node].kind != NodeKind::kOneOf) continue;
      for (int32_t y = b; y >= 0; y = pool_[y].below) {
        const Frame& fy = pool_[y];
        if (fy.node == fx.node && fy.below == fx.below && fy.a != fx.a) return true;
      }
    }
    return false;
  };
  for (int32_t i = s.tops_begin; i < s.tops_end; ++i) {
    if (!StackCanEnd(tops_[i])) continue;
    bool alone = true;
    for (int32_t j = s.tops_begin; j < s.tops_end && alone; ++j) {
      alone = j == i || !StackCanEnd(tops_[j]) || !conflicts(tops_[i], tops_[j]);
    }
    if (alone) return true;
  }
  return false;
}

bool Matcher::Done() const {
  const Step& s = steps_.back();
  if (s.ended) return true;
  for (int32_t i = s.tops_begin; i < s.tops_end; ++i) {
    if (tops_[i] != kDone) return false;
  }
  return true;
}

void Matcher::Walk(const TokenTrie& trie, uint64_t* mask) {
  const size_t depth = static_cast<size_t>(trie.max_depth) + 1;
  if (walk_end_.size() < depth) {
    walk_end_.resize(depth);
    walk_pool_.resize(depth);
  }
  walk_end_[0] = walk_tops_.size();
  walk_pool_[0] = pool_.size();
  for (int32_t i = 0; i < trie.size();) {
    const int d = trie.depth[i];
    walk_tops_.resize(walk_end_[d - 1]);
    pool_.resize(walk_pool_[d - 1]);
    const size_t begin = d == 1 ? 0 : walk_end_[d - 2];
    Advance(walk_tops_, begin, walk_end_[d - 1], trie.byte[i], walk_tops_);
    if (walk_tops_.size() == walk_end_[d - 1]) {
      i = trie.skip[i];
      continue;
    }
    walk_end_[d] = walk_tops_.size();
    walk_pool_[d] = pool_.size();
    for (int32_t k = trie.tok_begin[i]; k < trie.tok_begin[i + 1]; ++k) {
      const int32_t id = trie.ids[k];
      mask[id / 64] |= uint64_t{1} << (id % 64);
    }
    ++i;
  }
  pool_.resize(walk_pool_[0]);
}

void Matcher::FillMask(uint64_t* mask) {
  const Vocabulary& vocab = g_->vocab();
  std::fill(mask, mask + vocab.mask_words(), 0);
  const Step cur = steps_.back();
  if (cur.ended) return;
  walk_tops_.assign(tops_.begin() + cur.tops_begin, tops_.begin() + cur.tops_end);
  // A raw regex as the whole output: its per-state mask over the vocabulary.
  if (walk_tops_.size() == 1 && walk_tops_[0] >= 0 && pool_[walk_tops_[0]].below == kDone &&
      g_->nodes[pool_[walk_tops_[0]].node].kind == NodeKind::kRaw) {
    const Frame& f = pool_[walk_tops_[0]];
    const uint64_t* raw = g_->RawMask(g_->nodes[f.node].dfa, f.a);
    std::copy(raw, raw + vocab.mask_words(), mask);
    walk_tops_.clear();
    if (CanEnd()) {
      for (int32_t id : vocab.eos_ids()) mask[id / 64] |= uint64_t{1} << (id % 64);
    }
    return;
  }
  // Inside strings only: the plain tokens from the per-state masks, and a
  // walk over the tokens that close or escape.
  bool in_strings = true;
  for (int32_t top : walk_tops_) {
    if (top < 0) {
      in_strings = false;
      break;
    }
    const Frame& f = pool_[top];
    const Node& n = g_->nodes[f.node];
    if (f.a != 0 || (n.kind != NodeKind::kString && n.kind != NodeKind::kKey)) {
      in_strings = false;
      break;
    }
  }
  if (in_strings) {
    const int32_t words = vocab.mask_words();
    for (int32_t top : walk_tops_) {
      const Frame& f = pool_[top];
      const Node& n = g_->nodes[f.node];
      const uint64_t* plain;
      if (n.kind == NodeKind::kKey) {
        const Node& on = g_->nodes[n.object];
        const int32_t np = static_cast<int32_t>(on.props.size());
        const int32_t pos = pool_[f.below].b, next_required = on.next_required[pos];
        if (n.open && next_required == np) {
          plain = vocab.FreePlainMask(f.b, -1);  // any key may come: the DFA state tells nothing
        } else {
          plain = g_->KeyPlainMask(n.dfa, f.c, f.b, pos, std::min(next_required, np - 1),
                                   next_required == np ? np : -1);
        }
      } else {
        const int64_t room = n.max_length < 0 ? -1 : n.max_length - f.d;
        plain = g_->PlainMask(n.dfa, n.dfa < 0 ? 0 : f.c, f.b, room);
      }
      for (int32_t w = 0; w < words; ++w) mask[w] |= plain[w];
    }
    Walk(vocab.string_exits(), mask);
  } else {
    Walk(vocab.all(), mask);
  }
  walk_tops_.clear();
  if (CanEnd()) {
    for (int32_t id : vocab.eos_ids()) mask[id / 64] |= uint64_t{1} << (id % 64);
  }
}

}  // namespace duet::grammar

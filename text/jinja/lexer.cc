#include <cctype>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "text/jinja/ast.h"

namespace duet::text::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(absl::string_view src) : src_(src) {}

  absl::StatusOr<std::vector<Token>> Run() {
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);  // keep_trailing_newline off
    size_t pos = 0;
    bool strip_next = false, trim_next = false;
    while (pos < src_.size()) {
      size_t start = pos;
      while (start < src_.size() &&
             !(src_[start] == '{' && start + 1 < src_.size() && std::strchr("{%#", src_[start + 1]) != nullptr)) {
        ++start;
      }
      std::string text(src_.substr(pos, start - pos));
      if (strip_next) {
        size_t b = 0;
        while (b < text.size() && IsSpace(text[b])) ++b;
        text.erase(0, b);
      } else if (trim_next) {
        if (absl::StartsWith(text, "\n")) {
          text.erase(0, 1);
        } else if (absl::StartsWith(text, "\r\n")) {
          text.erase(0, 2);
        }
      }
      strip_next = trim_next = false;
      const int text_line = line_;
      CountLines(pos, start);
      if (start >= src_.size()) {
        if (!text.empty()) tokens_.push_back({Token::Type::kText, std::move(text), text_line});
        break;
      }
      const char kind = src_[start + 1];
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: spaces and tabs between a line's start and a block
        // or comment tag go.
        size_t j = start;
        while (j > pos && (src_[j - 1] == ' ' || src_[j - 1] == '\t')) --j;
        if (j == 0 || src_[j - 1] == '\n') text.resize(text.size() - std::min(text.size(), start - j));
      }
      if (!text.empty()) tokens_.push_back({Token::Type::kText, std::move(text), text_line});
      if (kind == '#') {
        const size_t end = src_.find("#}", start + 2);
        if (end == absl::string_view::npos) return Error(line_, "a comment ({#) is never closed");
        CountLines(start, end);
        strip_next = src_[end - 1] == '-';
        trim_next = !strip_next && src_[end - 1] != '+';
        pos = end + 2;
        continue;
      }
      const bool var = kind == '{';
      tokens_.push_back({var ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_});
      size_t p = start + 2;
      if (mod == '-' || mod == '+') ++p;
      auto ended = TagBody(var, &p, &strip_next);
      if (!ended.ok()) return ended.status();
      trim_next = !var && !strip_next && !*ended;
      tokens_.push_back({var ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_});
      pos = p;
    }
    tokens_.push_back({Token::Type::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  absl::Status Error(int line, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
  }
  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }
  bool At(size_t p, absl::string_view s) const { return src_.substr(p, s.size()) == s; }

  // One backslash escape of a string literal at *pp, as Python reads it
  // (an unknown one stays as written).
  void Escape(std::string* s, size_t* pp) {
    size_t& p = *pp;
    const char e = src_[p + 1];
    auto hex = [&](size_t n) -> bool {
      if (p + 2 + n > src_.size()) return false;
      uint32_t cp = 0;
      for (size_t k = 0; k < n; ++k) {
        const char h = src_[p + 2 + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
        cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      AppendUtf8(s, cp);
      p += 2 + n;
      return true;
    };
    switch (e) {
      case 'n': *s += '\n'; break;
      case 'r': *s += '\r'; break;
      case 't': *s += '\t'; break;
      case 'b': *s += '\b'; break;
      case 'f': *s += '\f'; break;
      case 'v': *s += '\v'; break;
      case 'a': *s += '\a'; break;
      case '0': *s += '\0'; break;
      case '\\': *s += '\\'; break;
      case '\'': *s += '\''; break;
      case '"': *s += '"'; break;
      case '\n': ++line_; break;  // a continued line
      case 'x':
        if (hex(2)) return;
        *s += "\\x";
        break;
      case 'u':
        if (hex(4)) return;
        *s += "\\u";
        break;
      case 'U':
        if (hex(8)) return;
        *s += "\\U";
        break;
      default:
        *s += '\\';
        *s += e;
    }
    p += 2;
  }

  // Tokens of one tag's inside, up to and past its closing delimiter. Sets
  // *strip for a `-` before it; returns whether a `+` was there.
  absl::StatusOr<bool> TagBody(bool var, size_t* pp, bool* strip) {
    size_t& p = *pp;
    const int open_line = line_;
    int depth = 0;
    for (;;) {
      while (p < src_.size() && IsSpace(src_[p])) {
        line_ += src_[p] == '\n';
        ++p;
      }
      if (p >= src_.size()) return Error(open_line, var ? "a {{ is never closed" : "a {% is never closed");
      const absl::string_view close = var ? "}}" : "%}";
      // "%}" ends a block tag even inside brackets (an unclosed one is then
      // the parser's error); "}}" may close a dict literal first.
      if (depth == 0 || !var) {
        if (At(p, close)) {
          p += 2;
          *strip = false;
          return false;
        }
        if ((src_[p] == '-' || src_[p] == '+') && At(p + 1, close)) {
          *strip = src_[p] == '-';
          p += 3;
          return src_[p - 3] == '+';
        }
      }
      const char c = src_[p];
      if (c == '\'' || c == '"') {
        std::string s;
        ++p;
        while (p < src_.size() && src_[p] != c) {
          if (src_[p] == '\\' && p + 1 < src_.size()) {
            Escape(&s, &p);
            continue;
          }
          line_ += src_[p] == '\n';
          s += src_[p++];
        }
        if (p >= src_.size()) return Error(open_line, "a string literal is never closed");
        ++p;
        tokens_.push_back({Token::Type::kString, std::move(s), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t b = p;
        bool is_float = false;
        while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
        if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
          is_float = true;
          ++p;
          while (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) ++p;
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            p = q;
            while (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) ++p;
          }
        }
        std::string num;
        for (char d : src_.substr(b, p - b)) {
          if (d != '_') num += d;
        }
        tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, std::move(num), line_});
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = p;
        while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
        tokens_.push_back({Token::Type::kName, std::string(src_.substr(b, p - b)), line_});
      } else {
        static constexpr const char* kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : kTwo) {
          if (At(p, t)) op = t;
        }
        if (op.empty()) {
          if (std::strchr("+-*/%~<>=()[]{},.:|", c) == nullptr) {
            return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "' in a tag"));
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        p += op.size();
        tokens_.push_back({Token::Type::kOp, std::move(op), line_});
      }
    }
  }

  absl::string_view src_;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(absl::string_view source) { return Lexer(source).Run(); }

}  // namespace duet::text::jinja

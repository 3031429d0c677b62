#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace duet::text::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.b_ = true;
  return v;
}
Value Value::MakeObject() {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::make_shared<Object>();
  return v;
}
Value Value::MakeNamespace() {
  Value v = MakeObject();
  v.object_->is_namespace = true;
  return v;
}
Value Value::MakeFunction(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

bool Value::is_namespace() const { return kind_ == Kind::kObject && object_->is_namespace; }

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u)) : Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = MakeObject();
      for (auto it = j.begin(); it != j.end(); ++it) v.object_->items.emplace_back(it.key(), FromJson(it.value()));
      return v;
    }
    default:
      return Value();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kObject:
      return object_->is_namespace || !object_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

namespace {

// Python's repr() of a float: the shortest text that reads back the same,
// with ".0" when it would look like an integer.
std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string StringRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\x%02x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

// Appends `s` as a JSON string; non-ASCII as \uXXXX (surrogate pairs above
// the BMP) when `ascii`.
void AppendJsonString(std::string* out, const std::string& s, bool ascii) {
  *out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    char hex[16];
    if (c < 0x20) {
      std::snprintf(hex, sizeof(hex), "\\u%04x", c);
      *out += hex;
    } else if (c < 0x80 || !ascii) {
      *out += static_cast<char>(c);
    } else {
      // Decode one UTF-8 sequence (malformed bytes pass as U+FFFD).
      uint32_t cp = 0xfffd;
      int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
      if (len > 1 && i + len <= s.size()) {
        cp = c & (0x7f >> len);
        for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
        i += len - 1;
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(hex, sizeof(hex), "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(hex, sizeof(hex), "\\u%04x", cp);
      }
      *out += hex;
    }
  }
  *out += '"';
}

absl::Status AppendJson(std::string* out, const Value& v, const JsonOptions& o, int depth) {
  std::string item_sep = o.indent ? "," : ", ", key_sep = ": ";
  if (o.separators) std::tie(item_sep, key_sep) = *o.separators;
  const std::string pad = o.indent ? std::string(static_cast<size_t>(*o.indent), ' ') : "";
  auto newline = [&](int d) {
    if (!o.indent) return;
    *out += '\n';
    for (int k = 0; k < d; ++k) *out += pad;
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      *out += FloatRepr(v.float_value());
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendJsonString(out, v.string_value(), o.ensure_ascii);
      return absl::OkStatus();
    case Value::Kind::kList: {
      *out += '[';
      const List& l = v.list();
      for (size_t i = 0; i < l.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        if (absl::Status s = AppendJson(out, l[i], o, depth + 1); !s.ok()) return s;
      }
      if (!l.empty()) newline(depth);
      *out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kObject: {
      *out += '{';
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : v.object().items) items.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        AppendJsonString(out, items[i]->first, o.ensure_ascii);
        *out += key_sep;
        if (absl::Status s = AppendJson(out, items[i]->second, o, depth + 1); !s.ok()) return s;
      }
      if (!items.empty()) newline(depth);
      *out += '}';
      return absl::OkStatus();
    }
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError(absl::StrCat("tojson: cannot write ", v.function_name(), " as JSON"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  if (absl::Status s = AppendJson(&out, v, options, 0); !s.ok()) return s;
  return out;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return StringRepr(s_);
    case Kind::kList: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) absl::StrAppend(&out, i > 0 ? ", " : "", (*list_)[i].Repr());
      if (b_ && list_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::kObject: {
      std::string out = object_->is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < object_->items.size(); ++i) {
        absl::StrAppend(&out, i > 0 ? ", " : "", StringRepr(object_->items[i].first), ": ",
                        object_->items[i].second.Repr());
      }
      return out + (object_->is_namespace ? "}>" : "}");
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", s_, ">");
  }
  return "";
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kInt && o.kind_ == Kind::kInt) return i_ == o.i_;
    return float_value() == o.float_value();
  }
  if (kind_ == Kind::kBool && o.is_number()) return Int(b_ ? 1 : 0).Equals(o);
  if (o.kind_ == Kind::kBool && is_number()) return o.Equals(*this);
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == o.b_;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kList:
      if (b_ != o.b_ || list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    case Kind::kObject: {
      if (object_ == o.object_) return true;
      if (object_->items.size() != o.object_->items.size()) return false;
      for (const auto& [k, v] : object_->items) {
        const Value* w = o.object_->Find(k);
        if (w == nullptr || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kObject:
      return object_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

const Value* Object::Find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Args::Get(size_t index, absl::string_view name) {
  if (index < positional.size()) return positional[index];
  for (auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return Value();
}

size_t CodePoints(absl::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

std::vector<std::string> SplitCodePoints(absl::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i + 1;
    while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xc0) == 0x80) ++j;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace duet::text::jinja

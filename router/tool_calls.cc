#include "router/tool_calls.h"

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace duet::router {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";
constexpr absl::string_view kPythonTag = "<|python_tag|>";

bool IsBlank(absl::string_view s) { return absl::StripAsciiWhitespace(s).empty(); }

// Where the JSON object starting at s[from] == '{' ends (one past its
// closing brace); npos when it does not close.
size_t ObjectEnd(absl::string_view s, size_t from) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return absl::string_view::npos;
}

// {"name": string, "arguments" | "parameters": object}, else nothing.
bool ParseCall(absl::string_view text, ParsedToolCall* out) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  Json args = Json::object();
  for (const char* key : {"arguments", "parameters"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      // Some models write the arguments as a JSON string.
      if (it->is_string()) {
        Json inner = Json::parse(it->get<std::string>(), nullptr, false);
        if (inner.is_discarded() || !inner.is_object()) return false;
        args = std::move(inner);
      } else if (it->is_object()) {
        args = *it;
      } else {
        return false;
      }
      break;
    }
  }
  out->name = name->get<std::string>();
  out->arguments = args.dump(-1, ' ', false, Json::error_handler_t::replace);
  return true;
}

}  // namespace

size_t PartialTail(absl::string_view s, absl::string_view word) {
  if (word.empty()) return 0;
  for (size_t k = std::min(word.size() - 1, s.size()); k > 0; --k) {
    if (absl::EndsWith(s, word.substr(0, k))) return k;
  }
  return 0;
}

ToolFormat ToolFormatOf(absl::string_view t) {
  if (absl::StrContains(t, kOpen)) return ToolFormat::kHermes;
  if (absl::StrContains(t, "\"parameters\"") && (absl::StrContains(t, kPythonTag) || absl::StrContains(t, "ipython"))) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kNone;
}

std::string ToolCallOpening(ToolFormat format, absl::string_view name) {
  // As the templates show the model its calls: Hermes's "<tool_call>\n{...}",
  // Llama-3.1's {"name": ..., "parameters": ...}.
  const absl::string_view open = format == ToolFormat::kHermes ? "<tool_call>\n{\"name\": \"" : "{\"name\": \"";
  if (name.empty()) return std::string(open);
  return absl::StrCat(open, name, "\", \"", format == ToolFormat::kHermes ? "arguments" : "parameters", "\": ");
}

ToolCallSplitter::ToolCallSplitter(ToolFormat format, int max_calls) : format_(format), max_calls_(max_calls) {}

void ToolCallSplitter::AddCall(absl::string_view json_text, absl::string_view raw, Out& out) {
  ParsedToolCall call;
  if (!ParseCall(absl::StripAsciiWhitespace(json_text), &call)) {
    absl::StrAppend(&out.content, raw);  // Not a call after all: nothing is lost.
    return;
  }
  if (max_calls_ == 0 || calls_ < max_calls_) out.calls.push_back(std::move(call));
  ++calls_;
}

ToolCallSplitter::Out ToolCallSplitter::Push(absl::string_view text) {
  Out out;
  if (format_ == ToolFormat::kNone) {
    out.content = std::string(text);
    return out;
  }
  absl::StrAppend(&buf_, text);
  if (format_ == ToolFormat::kLlama3Json) {
    if (!decided_) {
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(buf_);
      if (absl::ConsumePrefix(&rest, kPythonTag)) rest = absl::StripLeadingAsciiWhitespace(rest);
      if (rest.empty() || (rest.size() < kPythonTag.size() && absl::StartsWith(kPythonTag, rest))) return out;
      decided_ = true;
      json_ = rest.front() == '{';
    }
    if (!json_) out.content = std::exchange(buf_, "");
    return out;  // Calls: parsed whole at the end.
  }
  // Hermes.
  while (true) {
    if (in_call_) {
      const size_t close = absl::string_view(buf_).find(kClose);
      if (close == absl::string_view::npos) return out;
      const std::string body = buf_.substr(0, close);
      AddCall(body, absl::StrCat(kOpen, body, kClose), out);
      buf_.erase(0, close + kClose.size());
      in_call_ = false;
      continue;
    }
    const size_t open = absl::string_view(buf_).find(kOpen);
    if (open != absl::string_view::npos) {
      absl::string_view before(buf_.data(), open);
      if (calls_ == 0 || !IsBlank(before)) absl::StrAppend(&out.content, before);
      buf_.erase(0, open + kOpen.size());
      in_call_ = true;
      continue;
    }
    // No call starts here: show what cannot begin one; after a call, hold
    // whitespace that may only separate it from the next.
    const size_t keep = PartialTail(buf_, kOpen);
    absl::string_view safe(buf_.data(), buf_.size() - keep);
    if (calls_ > 0 && IsBlank(safe)) return out;
    absl::StrAppend(&out.content, safe);
    buf_.erase(0, safe.size());
    return out;
  }
}

ToolCallSplitter::Out ToolCallSplitter::Finish() {
  Out out;
  std::string rest = std::exchange(buf_, "");
  if (format_ == ToolFormat::kHermes) {
    if (in_call_) {
      AddCall(rest, absl::StrCat(kOpen, rest), out);  // Left open: a call if its JSON is whole.
    } else if (calls_ == 0 || !IsBlank(rest)) {
      out.content = std::move(rest);
    }
    in_call_ = false;
    return out;
  }
  if (format_ == ToolFormat::kLlama3Json && json_) {
    // One or more objects, separated by ';'.
    absl::string_view s = absl::StripLeadingAsciiWhitespace(rest);
    absl::ConsumePrefix(&s, kPythonTag);
    std::vector<ParsedToolCall> calls;
    bool whole = true;
    while (true) {
      s = absl::StripLeadingAsciiWhitespace(s);
      if (s.empty() || s.front() != '{') {
        whole = false;
        break;
      }
      const size_t end = ObjectEnd(s, 0);
      ParsedToolCall call;
      if (end == absl::string_view::npos || !ParseCall(s.substr(0, end), &call)) {
        whole = false;
        break;
      }
      calls.push_back(std::move(call));
      s = absl::StripLeadingAsciiWhitespace(s.substr(end));
      if (s.empty()) break;
      if (!absl::ConsumePrefix(&s, ";")) {
        whole = false;
        break;
      }
      if (IsBlank(s)) break;  // A trailing ';'.
    }
    if (!whole) {
      out.content = std::move(rest);
      return out;
    }
    for (ParsedToolCall& c : calls) {
      if (max_calls_ == 0 || calls_ < max_calls_) out.calls.push_back(std::move(c));
      ++calls_;
    }
    return out;
  }
  out.content = std::move(rest);
  return out;
}

}  // namespace duet::router

#include "router/reasoning.h"

#include "absl/strings/ascii.h"
#include "router/tool_calls.h"

namespace duet::router {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";

}  // namespace

bool TemplateThinks(absl::string_view chat_template) { return chat_template.find(kClose) != absl::string_view::npos; }

bool PromptOpensThinking(absl::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == absl::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == absl::string_view::npos || close < open;
}

ReasoningSplitter::ReasoningSplitter(bool in_thinking) : state_(in_thinking ? State::kThinking : State::kStart) {}

ReasoningSplitter::Out ReasoningSplitter::Push(absl::string_view text) {
  Out out;
  buf_.append(text.data(), text.size());
  if (state_ == State::kStart) {
    const absl::string_view rest = absl::StripLeadingAsciiWhitespace(buf_);
    if (rest.size() >= kOpen.size() && rest.substr(0, kOpen.size()) == kOpen) {
      buf_ = std::string(rest.substr(kOpen.size()));
      state_ = State::kThinking;
    } else if (kOpen.substr(0, rest.size()) == rest) {
      return out;  // Whitespace, or what may become <think>: held.
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kThinking) {
    const size_t close = buf_.find(kClose.data(), 0, kClose.size());
    if (close == std::string::npos) {
      const size_t keep = PartialTail(buf_, kClose);
      out.reasoning = buf_.substr(0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return out;
    }
    out.reasoning = buf_.substr(0, close);
    buf_.erase(0, close + kClose.size());
    state_ = State::kContent;
  }
  out.content = std::move(buf_);
  buf_.clear();
  return out;
}

ReasoningSplitter::Out ReasoningSplitter::Finish() {
  Out out;
  if (state_ == State::kThinking) {
    out.reasoning = std::move(buf_);
  } else {
    out.content = std::move(buf_);
  }
  buf_.clear();
  return out;
}

}  // namespace duet::router

// Tool calls in a model's output: the format a chat template teaches its
// model, and the splitter that turns a choice's text, as it arrives, into
// content and OpenAI tool calls.
//
//   ToolFormat f = ToolFormatOf(format.chat_template_source());   // kHermes for Qwen
//   ToolCallSplitter s(f, /*max_calls=*/0);
//   ToolCallSplitter::Out o = s.Push(text_delta);   // content to show, calls completed
//   ToolCallSplitter::Out last = s.Finish();        // the rest, at the choice's end
//
// Formats:
//   Hermes (Qwen2.5, Qwen3, Hermes): each call is
//     <tool_call>{"name": ..., "arguments": {...}}</tool_call>; text before
//     the first is content, whitespace between and after the calls is not.
//   Llama-3.1 JSON: an output that starts with `{` (after <|python_tag|>)
//     is one or more {"name": ..., "parameters": {...}} objects, separated
//     by `;`; any other output is content.
// A call whose JSON does not parse (or has no string "name") is nothing
// lost: its text goes out as content. Arguments are the JSON of the
// model's "arguments" (or "parameters") object, compact.
#ifndef DUET_ROUTER_TOOL_CALLS_H_
#define DUET_ROUTER_TOOL_CALLS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace duet::router {

enum class ToolFormat { kNone, kHermes, kLlama3Json };

// The longest tail of `s` that `word` starts with, shorter than `word`:
// what streamed text holds back while `word` may still complete (a call's
// tag here, a stop string in completions.cc).
size_t PartialTail(absl::string_view s, absl::string_view word);

// The format `chat_template` asks its model to call tools in; kNone when it
// names neither.
ToolFormat ToolFormatOf(absl::string_view chat_template);

// The text that opens a call in `format` (not kNone), up to the function's
// name when `name` is empty, else through the name and the key of its
// arguments: what a prompt ends with to make the model call a tool.
std::string ToolCallOpening(ToolFormat format, absl::string_view name);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text
};

class ToolCallSplitter {
 public:
  // `max_calls`: calls kept (0: any number); later ones are dropped, as
  // parallel_tool_calls false asks.
  ToolCallSplitter(ToolFormat format, int max_calls);

  struct Out {
    std::string content;
    std::vector<ParsedToolCall> calls;
  };
  // The content that `text` (the choice's next text) makes safe to show,
  // and the calls it completes. Text that may start a call is held back.
  Out Push(absl::string_view text);
  // Everything still held: a call left open at the end counts when its
  // JSON is whole.
  Out Finish();

 private:
  void AddCall(absl::string_view json_text, absl::string_view raw, Out& out);

  const ToolFormat format_;
  const int max_calls_;
  std::string buf_;      // Held text.
  bool in_call_ = false;  // Hermes: inside <tool_call>.
  bool json_ = false;     // Llama-3 JSON: the output is calls.
  bool decided_ = false;  // Llama-3 JSON: its first character seen.
  int calls_ = 0;         // Calls parsed (kept or not).
};

}  // namespace duet::router

#endif  // DUET_ROUTER_TOOL_CALLS_H_

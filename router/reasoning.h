// Reasoning in a model's output: the thinking a chat template teaches its
// model to write between <think> and </think> (Qwen3, DeepSeek-R1), split
// from the answer as it arrives, as vLLM's reasoning parsers do.
//
//   ReasoningSplitter s(/*in_thinking=*/PromptOpensThinking(prompt_text));
//   ReasoningSplitter::Out o = s.Push(text_delta);   // o.reasoning, o.content
//   ReasoningSplitter::Out last = s.Finish();
//
// Rules: an output that begins (after whitespace) with <think>, or follows
// a prompt that ends inside one, is reasoning up to </think> and content
// after it; any other output is content. Thinking the output never closes
// (cut by max_tokens) stays reasoning. The tags themselves are neither.
#ifndef DUET_ROUTER_REASONING_H_
#define DUET_ROUTER_REASONING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace duet::router {

// Whether a chat template's output can think (it writes </think>).
bool TemplateThinks(absl::string_view chat_template);
// Whether a rendered prompt ends inside a <think> the model is to continue.
bool PromptOpensThinking(absl::string_view prompt);

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool in_thinking);

  struct Out {
    std::string reasoning;
    std::string content;
  };
  // What `text` (the choice's next text) makes safe to show; text that may
  // still be a tag is held back.
  Out Push(absl::string_view text);
  // Everything still held, at the choice's end.
  Out Finish();

 private:
  enum class State { kStart, kThinking, kContent };
  State state_;
  std::string buf_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_REASONING_H_

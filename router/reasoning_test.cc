// The reasoning splitter: every way an output can be cut into pushes gives
// the reasoning and content the whole output gives, by the rules
// router/reasoning.h states.
#include "router/reasoning.h"

#include <catch2/catch.hpp>
#include <string>

namespace duet::router {
namespace {

// `text` pushed in pieces of `step` bytes, then finished.
ReasoningSplitter::Out Run(const std::string& text, bool open, size_t step) {
  ReasoningSplitter s(open);
  ReasoningSplitter::Out all;
  for (size_t i = 0; i < text.size(); i += step) {
    ReasoningSplitter::Out o = s.Push(text.substr(i, step));
    all.reasoning += o.reasoning;
    all.content += o.content;
  }
  ReasoningSplitter::Out o = s.Finish();
  all.reasoning += o.reasoning;
  all.content += o.content;
  return all;
}

TEST_CASE("thinking and answer split the same however the output arrives", "[reasoning]") {
  struct Case {
    std::string text;
    bool open;
    std::string reasoning, content;
  };
  for (const Case& c : {
           Case{"<think>\nplan it\n</think>\n\nThe answer.", false, "\nplan it\n", "\n\nThe answer."},
           Case{"\n <think>a</think>b", false, "a", "b"},             // whitespace before the tag
           Case{"The answer, no thinking.", false, "", "The answer, no thinking."},
           Case{"<thin k>", false, "", "<thin k>"},                     // not the tag
           Case{"plan it</think>answer", true, "plan it", "answer"},   // the prompt opened it
           Case{"<think>cut off by max_tokens", false, "cut off by max_tokens", ""},
           Case{"<think>x</think>a </think> b", false, "x", "a </think> b"},  // a later tag is content
           Case{"", false, "", ""},
       }) {
    for (size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000}}) {
      INFO(c.text << " open=" << c.open << " step " << step);
      const ReasoningSplitter::Out o = Run(c.text, c.open, step);
      CHECK(o.reasoning == c.reasoning);
      CHECK(o.content == c.content);
    }
  }
}

TEST_CASE("a template thinks when it writes </think>; a prompt opens thinking when it ends inside <think>",
          "[reasoning]") {
  CHECK(TemplateThinks("{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"));
  CHECK_FALSE(TemplateThinks("{{ messages[0].content }}"));
  CHECK(PromptOpensThinking("<|Assistant|><think>\n"));                    // DeepSeek-R1's prompt end
  CHECK_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // Qwen3, thinking off
  CHECK_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace duet::router

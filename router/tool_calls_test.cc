#include "router/tool_calls.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace duet::router {
namespace {

struct Result {
  std::string content;
  std::vector<ParsedToolCall> calls;
  std::vector<std::string> pieces;  // The content each Push released.
};

// `text` pushed `step` bytes at a time (0: whole), then Finish.
Result Run(ToolFormat f, const std::string& text, size_t step, int max_calls = 0) {
  ToolCallSplitter s(f, max_calls);
  Result r;
  auto take = [&](ToolCallSplitter::Out o) {
    r.pieces.push_back(o.content);
    r.content += o.content;
    for (auto& c : o.calls) r.calls.push_back(c);
  };
  if (step == 0) step = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += step) take(s.Push(text.substr(i, step)));
  take(s.Finish());
  return r;
}

const std::string kTwoCalls =
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
    "\"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n";

TEST_CASE("the template's text names its tool-call format") {
  CHECK(ToolFormatOf("... within <tool_call></tool_call> XML tags ...") == ToolFormat::kHermes);
  CHECK(ToolFormatOf("Respond in the format {\"name\": function name, \"parameters\": dictionary}. "
                     "{{- '<|python_tag|>' + tool_call.arguments }}") == ToolFormat::kLlama3Json);
  CHECK(ToolFormatOf("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}") == ToolFormat::kNone);
  CHECK(ToolFormatOf("\"parameters\" alone") == ToolFormat::kNone);
}

TEST_CASE("Hermes: content before the calls, each call parsed, whatever the pieces the text arrives in") {
  for (size_t step : {size_t{0}, size_t{1}, size_t{3}, size_t{7}}) {
    INFO("step " << step);
    Result r = Run(ToolFormat::kHermes, kTwoCalls, step);
    CHECK(r.content == "Let me check.\n");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == "{\"city\":\"Paris\",\"unit\":\"celsius\"}");
    CHECK(r.calls[1].name == "get_time");
    CHECK(r.calls[1].arguments == "{}");
    // No piece of a tag ever reaches the client.
    for (const std::string& p : r.pieces) CHECK_FALSE(absl::StrContains(p, "<"));
  }
}

TEST_CASE("Hermes: text that only looks like a call is content, byte for byte") {
  const std::string text = "a <tool> b <tool_ca and <tool_call_x> c";
  for (size_t step : {size_t{0}, size_t{1}, size_t{4}}) {
    Result r = Run(ToolFormat::kHermes, text, step);
    CHECK(r.content == text);
    CHECK(r.calls.empty());
  }
}

TEST_CASE("Hermes: a call whose JSON does not parse goes out as content; a call left open counts when whole") {
  Result bad = Run(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>", 2);
  CHECK(bad.calls.empty());
  CHECK(bad.content == "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>");

  Result no_name = Run(ToolFormat::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>", 0);
  CHECK(no_name.calls.empty());
  CHECK(no_name.content == "<tool_call>{\"arguments\": {}}</tool_call>");

  Result open = Run(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n", 5);
  REQUIRE(open.calls.size() == 1);
  CHECK(open.calls[0].arguments == "{\"x\":[1,2]}");
  CHECK(open.content.empty());

  Result cut = Run(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"argu", 5);
  CHECK(cut.calls.empty());
  CHECK(cut.content == "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST_CASE("Hermes: arguments written as a JSON string, and text after the calls") {
  Result r = Run(ToolFormat::kHermes,
                 "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}</tool_call> then more", 3);
  REQUIRE(r.calls.size() == 1);
  CHECK(r.calls[0].arguments == "{\"q\":\"x\"}");
  CHECK(r.content == " then more");
}

TEST_CASE("parallel_tool_calls false: the first call alone is kept") {
  Result r = Run(ToolFormat::kHermes, kTwoCalls, 4, /*max_calls=*/1);
  REQUIRE(r.calls.size() == 1);
  CHECK(r.calls[0].name == "get_weather");
}

TEST_CASE("Llama-3.1 JSON: an output that is calls, with or without <|python_tag|>; any other is content") {
  const std::string two = "{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"parameters\": {}}";
  for (const std::string& text : {two, "<|python_tag|>" + two, "  \n" + two + ";"}) {
    for (size_t step : {size_t{0}, size_t{1}, size_t{6}}) {
      INFO(text << " step " << step);
      Result r = Run(ToolFormat::kLlama3Json, text, step);
      CHECK(r.content.empty());
      REQUIRE(r.calls.size() == 2);
      CHECK(r.calls[0].name == "f");
      CHECK(r.calls[0].arguments == "{\"x\":1}");
      CHECK(r.calls[1].name == "g");
    }
  }
  Result prose = Run(ToolFormat::kLlama3Json, "The answer is {x}.", 1);
  CHECK(prose.content == "The answer is {x}.");
  CHECK(prose.calls.empty());
  CHECK(prose.pieces.size() > 2);  // Streamed as it comes, not held to the end.

  const std::string broken = "{\"name\": \"f\", \"parameters\": {\"x\": 1}} and then {\"name\"";
  Result b = Run(ToolFormat::kLlama3Json, broken, 4);
  CHECK(b.content == broken);
  CHECK(b.calls.empty());
}

TEST_CASE("a call's opening, fed first, is continued by the output in either format") {
  CHECK(ToolCallOpening(ToolFormat::kHermes, "") == "<tool_call>\n{\"name\": \"");
  CHECK(ToolCallOpening(ToolFormat::kHermes, "f") == "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
  CHECK(ToolCallOpening(ToolFormat::kLlama3Json, "f") == "{\"name\": \"f\", \"parameters\": ");
  struct Case {
    ToolFormat format;
    std::string name, output;
  };
  for (const Case& c : std::vector<Case>{{ToolFormat::kHermes, "", "get_time\", \"arguments\": {\"x\": 1}}</tool_call>"},
                                         {ToolFormat::kHermes, "get_time", "{\"x\": 1}}\n</tool_call>"},
                                         {ToolFormat::kLlama3Json, "", "get_time\", \"parameters\": {\"x\": 1}}"},
                                         {ToolFormat::kLlama3Json, "get_time", "{\"x\": 1}}"}}) {
    INFO(c.name << " " << c.output);
    ToolCallSplitter s(c.format, 0);
    ToolCallSplitter::Out opened = s.Push(ToolCallOpening(c.format, c.name));
    CHECK(opened.content.empty());
    ToolCallSplitter::Out a = s.Push(c.output), b = s.Finish();
    CHECK(a.content + b.content == "");
    a.calls.insert(a.calls.end(), b.calls.begin(), b.calls.end());
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].name == "get_time");
    CHECK(a.calls[0].arguments == "{\"x\":1}");
  }
  // An output that breaks the call: the opening and the output, as content.
  ToolCallSplitter s(ToolFormat::kHermes, 0);
  s.Push(ToolCallOpening(ToolFormat::kHermes, "f"));
  CHECK(s.Push("oops").content.empty());
  CHECK(s.Finish().content == "<tool_call>\n{\"name\": \"f\", \"arguments\": oops");
}

}  // namespace
}  // namespace duet::router

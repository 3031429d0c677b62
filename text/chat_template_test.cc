#include "text/chat_template.h"

#include "text/chat_templates.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace duet::text {
namespace {

using Catch::Matchers::Contains;

const std::vector<ChatMessage> kConversation = {
    {"system", "You answer briefly."},
    {"user", "  What is prefill?\n"},
    {"assistant", "Running the prompt."},
    {"user", "And decode?"},
};

// A tokenizer_config.json with `tmpl`, its BOS and both families' special
// tokens in added_tokens_decoder.
std::string Config(const std::string& tmpl, const std::string& bos, bool add_bos) {
  nlohmann::json j = {{"bos_token", bos}, {"eos_token", "<|eot_id|>"}, {"add_bos_token", add_bos},
                      {"chat_template", tmpl}};
  int id = 100;
  for (ChatFormat f : {ChatFormat::kLlama3, ChatFormat::kChatML}) {
    for (const std::string& t : SpecialTokensFor(f)) {
      j["added_tokens_decoder"][std::to_string(id++)] = {{"content", t}, {"special", true}};
    }
  }
  return j.dump();
}

TEST_CASE("Llama-3: header tokens, trimmed content, BOS once, generation prompt", "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(Config(kLlama3ChatTemplate, "<|begin_of_text|>", true),
                                              "tokenizer_config.json");
  REQUIRE(pf.ok());
  REQUIRE(pf->has_chat_template());
  // Written out from the template: bos_token before the first message; each
  // message '<|start_header_id|>' + role + '<|end_header_id|>\n\n' +
  // (content | trim) + '<|eot_id|>'; then the assistant header.
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer briefly.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is prefill?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nRunning the prompt.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nAnd decode?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  auto got = pf->RenderChat(kConversation, true);
  REQUIRE(got.ok());
  REQUIRE(*got == want);
  auto no_gen = pf->RenderChat(kConversation, false);
  REQUIRE(*no_gen == want.substr(0, want.size() - std::string("<|start_header_id|>assistant<|end_header_id|>\n\n").size()));
  REQUIRE(pf->CompletionPrefix() == "<|begin_of_text|>");
}

TEST_CASE("ChatML: im_start/im_end, default system prompt only without a system message", "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(Config(kChatMLChatTemplate, "", false), "tc.json");
  REQUIRE(pf.ok());
  REQUIRE(pf->has_chat_template());
  const std::string want =
      "<|im_start|>system\nYou answer briefly.<|im_end|>\n"
      "<|im_start|>user\n  What is prefill?\n<|im_end|>\n"
      "<|im_start|>assistant\nRunning the prompt.<|im_end|>\n"
      "<|im_start|>user\nAnd decode?<|im_end|>\n"
      "<|im_start|>assistant\n";
  REQUIRE(*pf->RenderChat(kConversation, true) == want);
  std::vector<ChatMessage> no_system(kConversation.begin() + 1, kConversation.end());
  auto got = pf->RenderChat(no_system, true);
  REQUIRE(got.ok());
  REQUIRE(got->rfind("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n", 0) == 0);
  REQUIRE(pf->CompletionPrefix().empty());
}

TEST_CASE("documents (duet's fallback): system turns after the system message, in order, their starts before "
          "special tokens",
          "[chat]") {
  const std::vector<ChatDocument> docs = {{"", "", "Prefill runs the prompt."},
                                          {"kv-7", "On decode", "Decode adds one token a step."}};
  const std::vector<ChatMessage> question = {{"system", "Use the documents."}, {"user", "What is decode?"}};
  SECTION("Llama-3") {
    auto pf = PromptFormat::FromTokenizerConfig(Config(kLlama3ChatTemplate, "<|begin_of_text|>", true), "tc.json");
    REQUIRE(pf.ok());
    std::vector<size_t> starts;
    auto got = pf->RenderChat(question, true, docs, &starts);
    REQUIRE(got.ok());
    const std::string head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nUse the documents.<|eot_id|>";
    const std::string d1 = "<|start_header_id|>system<|end_header_id|>\n\nDocument 1\nPrefill runs the prompt.<|eot_id|>";
    const std::string d2 =
        "<|start_header_id|>system<|end_header_id|>\n\nDocument kv-7: On decode\nDecode adds one token a step.<|eot_id|>";
    const std::string tail =
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is decode?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(*got == head + d1 + d2 + tail);
    CHECK(starts == std::vector<size_t>{head.size(), head.size() + d1.size(), head.size() + d1.size() + d2.size()});
    // Without a system message, the documents come first: BOS, then the
    // first document's turn with the prompt's start, so no start before it.
    auto bare = pf->RenderChat({{"user", "What is decode?"}}, true, docs, &starts);
    REQUIRE(bare.ok());
    CHECK(*bare == "<|begin_of_text|>" + d1 + d2 + tail);
    CHECK(starts == std::vector<size_t>{std::string("<|begin_of_text|>").size() + d1.size(),
                                        std::string("<|begin_of_text|>").size() + d1.size() + d2.size()});
  }
  SECTION("ChatML") {
    auto pf = PromptFormat::FromTokenizerConfig(Config(kChatMLChatTemplate, "", false), "tc.json");
    REQUIRE(pf.ok());
    std::vector<size_t> starts;
    auto got = pf->RenderChat({{"system", "Be brief."}, {"user", "What is decode?"}}, true, docs, &starts);
    REQUIRE(got.ok());
    const std::string head = "<|im_start|>system\nBe brief.<|im_end|>\n";
    const std::string d1 = "<|im_start|>system\nDocument 1\nPrefill runs the prompt.<|im_end|>\n";
    const std::string d2 = "<|im_start|>system\nDocument kv-7: On decode\nDecode adds one token a step.<|im_end|>\n";
    const std::string tail = "<|im_start|>user\nWhat is decode?<|im_end|>\n<|im_start|>assistant\n";
    CHECK(*got == head + d1 + d2 + tail);
    CHECK(starts == std::vector<size_t>{head.size(), head.size() + d1.size(), head.size() + d1.size() + d2.size()});
  }
  SECTION("a template that reads documents gets them, and reports no starts") {
    const std::string tmpl =
        "{% for d in documents %}[{{ d.title or d.id or loop.index }}] {{ d.text }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    auto pf = PromptFormat::FromTokenizerConfig(Config(tmpl, "", false), "tc.json");
    REQUIRE(pf.ok());
    std::vector<size_t> starts = {3};
    auto got = pf->RenderChat(question, true, docs, &starts);
    REQUIRE(got.ok());
    CHECK(*got == "[1] Prefill runs the prompt.\n[On decode] Decode adds one token a step.\n"
                  "system: Use the documents.\nuser: What is decode?\n");
    CHECK(starts.empty());
  }
  SECTION("a template that allows one system message: the documents join it, no starts") {
    const std::string tmpl =
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('one system message only') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    auto pf = PromptFormat::FromTokenizerConfig(Config(tmpl, "", false), "tc.json");
    REQUIRE(pf.ok());
    std::vector<size_t> starts;
    auto got = pf->RenderChat({{"user", "Q?"}}, true, docs, &starts);
    REQUIRE(got.ok());
    CHECK(*got == "<system>Document 1\nPrefill runs the prompt.\n\nDocument kv-7: On decode\nDecode adds one token "
                  "a step.<user>Q?");
    CHECK(starts.empty());
  }
  SECTION("no documents: the same text as before, no starts") {
    auto pf = PromptFormat::FromTokenizerConfig(Config(kChatMLChatTemplate, "", false), "tc.json");
    REQUIRE(pf.ok());
    std::vector<size_t> starts = {7};
    auto got = pf->RenderChat(kConversation, true, {}, &starts);
    REQUIRE(got.ok());
    CHECK(*got == *pf->RenderChat(kConversation, true));
    CHECK(starts.empty());
  }
}

TEST_CASE("a template duet cannot render serves completions, chat says why; malformed files are errors",
          "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(Config("a\n{% extends 'base' %}", "<s>", true), "/m/tokenizer_config.json");
  REQUIRE(pf.ok());
  REQUIRE_FALSE(pf->has_chat_template());
  REQUIRE(pf->CompletionPrefix() == "<s>");
  auto r = pf->RenderChat(kConversation, true);
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(r.status().message()), Contains("/m/tokenizer_config.json"));
  REQUIRE_THAT(std::string(r.status().message()), Contains("line 2: unknown or unsupported statement 'extends'"));
  auto bad = PromptFormat::FromTokenizerConfig("{\"chat_template\": ", "/m/tokenizer_config.json");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(bad.status().message()), Contains("/m/tokenizer_config.json"));
}

TEST_CASE("a template's own error is the request's error, with its line", "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(
      Config("{% if messages[0].role != 'user' %}\n{{ raise_exception('start with a user turn') }}{% endif %}ok", "",
             false),
      "tc.json");
  REQUIRE(pf.ok());
  auto r = pf->RenderChat(kConversation, true);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(r.status().message()), Contains("line 2"));
  REQUIRE_THAT(std::string(r.status().message()), Contains("start with a user turn"));
  REQUIRE(*pf->RenderChat({{"user", "hi"}}, true) == "ok");
}

TEST_CASE("a request's chat_template_kwargs are the template's variables; its own variables win", "[chat]") {
  // The end of Qwen3's template: no thinking when enable_thinking is false.
  auto pf = PromptFormat::FromTokenizerConfig(
      Config("{{ messages[0].content }}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
             "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
             "{%- endif %}{%- endif %}",
             "", false),
      "tc.json");
  REQUIRE(pf.ok());
  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  CHECK(*pf->RenderChat(hi, true) == "hi<|im_start|>assistant\n");
  const nlohmann::ordered_json off = {{"enable_thinking", false}};
  CHECK(*pf->RenderChat(hi, true, {}, nullptr, nullptr, off) == "hi<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const nlohmann::ordered_json on = {{"enable_thinking", true}};
  CHECK(*pf->RenderChat(hi, true, {}, nullptr, nullptr, on) == "hi<|im_start|>assistant\n");
  // A variable named as one the template is always given does not replace it.
  const nlohmann::ordered_json clash = {{"messages", nlohmann::ordered_json::array()},
                                        {"add_generation_prompt", false}};
  CHECK(*pf->RenderChat(hi, true, {}, nullptr, nullptr, clash) == "hi<|im_start|>assistant\n");
}

TEST_CASE("no template: completions only, chat is a clear error", "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(R"({"bos_token": "<s>", "add_bos_token": true})", "tc.json");
  REQUIRE(pf.ok());
  REQUIRE_FALSE(pf->has_chat_template());
  REQUIRE(pf->CompletionPrefix() == "<s>");
  auto r = pf->RenderChat(kConversation, true);
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(r.status().message()), Contains("chat_template"));
}

TEST_CASE("unknown roles and empty conversations are refused", "[chat]") {
  auto pf = PromptFormat::FromTokenizerConfig(Config(kChatMLChatTemplate, "", false), "tc.json");
  REQUIRE(pf->RenderChat({}, true).status().code() == absl::StatusCode::kInvalidArgument);
  auto r = pf->RenderChat({{"robot", "x"}}, true);
  REQUIRE_THAT(std::string(r.status().message()), Contains("messages[0].role"));
}

}  // namespace
}  // namespace duet::text

// libFuzzer target for the request parser: any bytes as the body of
// /v1/completions and /v1/chat/completions. A body that parses is then
// rendered as the router would (choices fed with tokens taken from the
// input, stop strings, logprobs, the final and usage chunks), and every
// output must be valid JSON; an error must be a 400 or 404 with OpenAI's
// error shape. Anything else aborts, as do sanitizer findings.
//
//   bazel run --config=fuzz //router:request_fuzzer -- -max_total_time=60 router/fuzz_corpus
//
// Without --config=fuzz (g++, no libFuzzer) the same entry point runs as
// //router:request_fuzzer_test over the corpus and seeded mutations of it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "router/completions.h"
#include "engine/testing/tiny_model.h"

namespace {

struct Model {
  Model() {
    const std::string dir = duet::testing::TinyModelDir("llama");
    tokenizer = std::move(duet::text::Tokenizer::Load(dir)).value();
    format = std::move(duet::text::PromptFormat::Load(dir)).value();
    served = {.name = "tiny", .tokenizer = tokenizer.get(), .format = &format, .max_model_len = 256};
  }
  std::unique_ptr<duet::text::Tokenizer> tokenizer;
  duet::text::PromptFormat format;
  duet::router::ServedModel served;
};

void Require(bool ok, const char* what, absl::string_view detail) {
  if (ok) return;
  std::fprintf(stderr, "request_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void RequireJson(const std::string& text, const char* what) {
  Require(nlohmann::json::accept(text), what, text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet::router;
  static Model* m = new Model();
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    auto r = kind == ApiKind::kChat ? ParseChatRequest(body, m->served, 1) : ParseCompletionRequest(body, m->served, 1);
    if (!r.ok()) {
      const int status = HttpStatusFor(r.status());
      Require(status == 400 || status == 404, "unexpected status", r.status().ToString());
      const std::string err = ErrorJson(r.status());
      RequireJson(err, "error body");
      Require(nlohmann::json::parse(err)["error"]["message"].is_string(), "error message", err);
      continue;
    }
    Require(r->n >= 1 && r->n <= kMaxChoices, "n out of range", body);
    Require(r->spec.prompt_ids_size() > 0 && r->spec.prompt_ids_size() < m->served.max_model_len, "prompt length",
            body);
    Require(r->prompts() <= kMaxPrompts && r->prompts() * r->n <= kMaxBatchChoices, "batch size", body);
    for (const auto& p : r->more_prompts) {
      Require(!p.ids.empty() && static_cast<int64_t>(p.ids.size()) < m->served.max_model_len, "batch prompt length",
              body);
    }
    const ResponseEnvelope env{.kind = kind, .id = "x", .created = 1, .model = "tiny", .system_fingerprint = "fp"};
    std::vector<std::unique_ptr<ChoiceBuilder>> choices;
    std::vector<ChoiceBuilder*> raw;
    std::vector<std::string> reasons;
    const int vocab = m->tokenizer->vocab_size();
    for (int i = 0; i < std::min(r->n, 3); ++i) {
      choices.push_back(std::make_unique<ChoiceBuilder>(m->tokenizer.get(), *r, i, r->echo_text));
      raw.push_back(choices.back().get());
      // Tokens from the input's bytes: arbitrary ids, special ones included.
      for (size_t k = 0; k < std::min<size_t>(size, 48); ++k) {
        duet::proto::Token t;
        t.set_id(static_cast<int32_t>((data[k] * 131 + k * 7 + i) % vocab));
        t.set_logprob(-static_cast<float>(data[k]) / 16.0f);
        auto* top = t.add_top();
        top->set_id(static_cast<int32_t>((data[k] * 17 + 3) % vocab));
        top->set_logprob(-0.5f);
        const std::string chunk = choices.back()->AddToken(t, env, r->stream);
        if (!chunk.empty()) RequireJson(chunk, "stream chunk");
        if (choices.back()->stopped()) break;
      }
      reasons.push_back(choices.back()->stopped() ? "stop" : "length");
      if (r->stream) RequireJson(choices.back()->FinalChunk(env, reasons.back()), "final chunk");
    }
    RequireJson(RenderUsageChunk(env, r->spec.prompt_ids_size(), 3), "usage chunk");
    // A fresh set for the non-stream body (FinalChunk flushed the others).
    RequireJson(RenderResponse(env, raw, reasons, r->spec.prompt_ids_size()), "response body");
  }
  return 0;
}

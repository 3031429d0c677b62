// The OpenAI completions and chat completions APIs as the router speaks them:
// request validation (JSON body -> CompletionRequest) and response rendering
// (tokens -> JSON bodies and SSE chunks). Pure: no network, no locks, so
// every rule is unit-tested.
//
//   ASSIGN_OR_RETURN(CompletionRequest r, ParseCompletionRequest(body, model, seed));  // or ParseChatRequest
//   ResponseEnvelope env{.kind = r.kind, .id = "cmpl-1", .created = t, .model = "tiny"};
//   ChoiceBuilder c(model.tokenizer, r, /*index=*/0);
//   std::string chunk = c.AddToken(token, env, /*chunk=*/true);   // one SSE event
//   if (c.stopped()) ...                                           // a stop string matched
//   std::string body = RenderResponse(env, {&c}, {"stop"}, prompt_tokens);
//
// Stop strings are matched on the detokenized text: text that may still
// become a stop string is held back, so a stop string never reaches the
// client, also when it is split across tokens; the choice ends at the token
// that completes it (finish_reason "stop"), that token counted in usage.
//
// Errors are Status values that carry the HTTP shape: InvalidArgument ->
// 400, NotFound -> 404 (model_not_found), Unauthenticated -> 401,
// ResourceExhausted -> 429, Unavailable -> 503; the offending request field
// rides along as a payload (ErrorParam), and ErrorJson renders OpenAI's
// {"error": {"message", "type", "param", "code"}}.
#ifndef DUET_ROUTER_COMPLETIONS_H_
#define DUET_ROUTER_COMPLETIONS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spec/model_config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "grammar/constraint.h"
#include "proto/control.pb.h"
#include "router/reasoning.h"
#include "router/tool_calls.h"

namespace duet::router {

// What validation needs to know about the served model.
struct ServedModel {
  std::string name;                               // The "model" clients must send.
  const text::Tokenizer* tokenizer = nullptr;   // Not owned.
  const text::PromptFormat* format = nullptr;   // Not owned.
  int64_t max_model_len = 0;                      // Context in tokens.
  // Token ids a prompt may hold: the model's embedding rows (config.json's
  // vocab_size), which may exceed the tokenizer's; 0: the tokenizer's.
  int64_t vocab_size = 0;
  // generation_config.json's sampling fields: a request's where it sets none.
  spec::ModelConfig::SamplingDefaults sampling_defaults;
  // The message field chat reasoning goes out in (RouterOptions::reasoning_field).
  std::string reasoning_field = "reasoning";
  // Compiles structured outputs' grammars to check them (not owned); null:
  // structured outputs are refused.
  grammar::LazyGrammarCache* grammars = nullptr;
};

enum class ApiKind { kCompletion, kChat };

struct CompletionRequest {
  ApiKind kind = ApiKind::kCompletion;
  // prompt_ids, sampling (seed filled), max_tokens, ignore_eos; choice_index
  // 0 (the router numbers the choices).
  proto::GenerationSpec spec;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
  // Completions: "logprobs": N (top-N per token). Chat: "logprobs": true with
  // "top_logprobs": N. -1: no logprobs.
  int logprobs = -1;
  int n = 1;                      // Choices.
  std::vector<std::string> stop;  // Stop strings, at most kMaxStop.
  std::string echo_text;          // Completions with "echo": the prompt's text.
  bool echo = false;
  // A batch of prompts (completions): those after the first, which spec and
  // echo_text hold. Prompt i's choice j is choice i x n + j, as OpenAI
  // numbers them.
  struct Prompt {
    std::vector<int32_t> ids;
    std::string echo_text;  // With "echo".
  };
  std::vector<Prompt> more_prompts;
  int prompts() const { return 1 + static_cast<int>(more_prompts.size()); }
  // Chat with tools (tool_choice other than none): the output is parsed
  // into calls in this format; at most max_tool_calls of them (0: any number).
  ToolFormat tool_format = ToolFormat::kNone;
  int max_tool_calls = 0;
  // tool_choice required or naming a function: the opening of a call in
  // tool_format (ToolCallOpening), which ends the prompt, so the model's
  // output continues a call; the output is parsed as if it followed it.
  std::string tool_prefix;
  // Chat with a template that thinks (router/reasoning.h): the output's
  // <think> text goes out in reasoning_field, apart from the content;
  // reasoning_open when the prompt ends inside a <think>.
  bool reasoning = false;
  bool reasoning_open = false;
  std::string reasoning_field = "reasoning";
  // Structured outputs: the grammar the output follows (spec.grammar holds
  // it as sent), and the request field that asked for it.
  std::optional<grammar::ConstraintRequest> grammar;
  std::string grammar_param;
};

inline constexpr int kDefaultMaxTokens = 16;  // /v1/completions; chat: the context's rest.
inline constexpr int kMaxLogprobs = 20;
inline constexpr int kMaxChoices = 16;
inline constexpr int kMaxPrompts = 64;         // Prompts in one completions batch.
inline constexpr int kMaxBatchChoices = 256;  // Prompts x n.
inline constexpr int kMaxStop = 4;
inline constexpr int kMaxStopBytes = 256;

// Validates a /v1/completions body. `default_seed` is used when the body
// has no "seed" (the router passes a random one).
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body, const ServedModel& model,
                                                         uint64_t default_seed);
// Validates a /v1/chat/completions body: "messages" rendered with the
// model's chat template.
absl::StatusOr<CompletionRequest> ParseChatRequest(absl::string_view body, const ServedModel& model,
                                                   uint64_t default_seed);

// Errors in the API's terms.
absl::Status ParamError(absl::string_view param, absl::string_view message);
// An error with OpenAI's "code" field set (e.g. "invalid_api_key").
absl::Status WithCode(absl::Status status, absl::string_view code);
std::string ErrorParam(const absl::Status& status);  // "" when none.
int HttpStatusFor(const absl::Status& status);
// OpenAI's error object, {"error": {...}}, for a non-OK status.
std::string ErrorJson(const absl::Status& status);

// What every response object of one request shares.
struct ResponseEnvelope {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string system_fingerprint;
};

// Accumulates one choice's tokens and renders its parts.
class ChoiceBuilder {
 public:
  // `echo_text`: the prompt's text when params.echo.
  ChoiceBuilder(const text::Tokenizer* tokenizer, const CompletionRequest& params, int index,
                const std::string& echo_text);

  // Adds a generated token. Returns its SSE chunk's JSON when `chunk` (with
  // the text it makes safe to show; the first chunk of a chat choice also
  // carries the role, the first of an echoed completion the prompt). After
  // stopped(), further tokens are ignored and return "".
  std::string AddToken(const proto::Token& token, const ResponseEnvelope& env, bool chunk);
  // The choice's last stream chunk: text still held back (none after a stop
  // string), and finish_reason.
  std::string FinalChunk(const ResponseEnvelope& env, absl::string_view finish_reason);

  // A stop string matched: the choice is over, with finish_reason "stop".
  bool stopped() const { return stopped_; }
  // The finish reason the client sees for the worker's `reason`: a choice
  // that ended ("stop") having called tools says "tool_calls".
  std::string FinishReason(absl::string_view reason) const;
  int index() const { return index_; }
  const std::vector<int32_t>& token_ids() const { return ids_; }
  // Tokens the client is charged for (up to the one that completed a stop).
  int64_t completion_tokens() const { return static_cast<int64_t>(ids_.size()); }
  // The whole text so far, as the non-stream response shows it (its
  // content, when tools are parsed).
  std::string FullText();

 private:
  struct LpEntry {
    int32_t id = 0;
    std::string text;   // Its text; "bytes:\xNN..." when its bytes are not UTF-8 on their own.
    std::string bytes;  // The token's own bytes.
    float logprob = 0;
  };
  friend std::string RenderResponse(const ResponseEnvelope&, const std::vector<ChoiceBuilder*>&,
                                    const std::vector<std::string>&, int64_t, int64_t);
  // Text shown from this token on: held-back text and stop strings applied.
  std::string Release(const std::string& piece);
  // Calls from `calls_begin` on are new in this chunk.
  std::string ChunkJson(const ResponseEnvelope& env, const std::string& text, const std::vector<int32_t>& ids,
                        size_t lp_begin, size_t lp_end, std::optional<absl::string_view> finish_reason,
                        size_t calls_begin);
  // Text past stop strings, through the tool-call splitter: content out,
  // calls into calls_.
  std::string Split(std::string text, bool last);
  nlohmann::ordered_json CallJson(const ResponseEnvelope& env, size_t k, bool with_index) const;
  nlohmann::ordered_json LogprobsJson(size_t begin, size_t end) const;  // null when off
  LpEntry Entry(int32_t id, float logprob) const;

  const text::Tokenizer* tokenizer_;
  const ApiKind kind_;
  const int index_;
  const int logprobs_;
  const std::vector<std::string> stop_;
  const std::string echo_text_;
  text::IncrementalDetokenizer detok_;
  std::string shown_;    // Text released to the client.
  std::string held_;     // Text that may still start a stop string.
  int64_t text_chars_;   // Code points before the next token's text (echo included).
  bool first_chunk_ = true;
  bool finished_ = false;
  bool stopped_ = false;
  std::vector<int32_t> ids_;
  // Logprobs, one entry per token.
  std::vector<LpEntry> lp_tokens_;
  std::vector<std::vector<LpEntry>> lp_top_;  // Distinct tokens, best first.
  std::vector<int64_t> lp_offsets_;
  std::optional<ToolCallSplitter> tools_;  // Set when tools are parsed.
  std::optional<ReasoningSplitter> reasoning_;  // Set when the template thinks.
  const std::string reasoning_field_;
  std::string reasoning_text_;     // All the reasoning so far.
  std::string pending_reasoning_;  // Reasoning the next chunk carries.
  std::vector<ParsedToolCall> calls_;
};

// The stream_options.include_usage chunk (empty choices, usage).
// Usage carries prompt_tokens_details.cached_tokens, as OpenAI's does.
std::string RenderUsageChunk(const ResponseEnvelope& env, int64_t prompt_tokens, int64_t completion_tokens,
                             int64_t cached_tokens = 0);
// The whole non-stream response body: the choices in order, each with its
// finish reason; usage sums the choices.
std::string RenderResponse(const ResponseEnvelope& env, const std::vector<ChoiceBuilder*>& choices,
                           const std::vector<std::string>& finish_reasons, int64_t prompt_tokens,
                           int64_t cached_tokens = 0);

}  // namespace duet::router

#endif  // DUET_ROUTER_COMPLETIONS_H_

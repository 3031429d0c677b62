// The OpenAI completions API as the router speaks it: request validation
// (JSON body -> GenerationSpec) and response rendering (tokens -> JSON / SSE
// chunks). Pure: no network, no locks, so every rule is unit-tested.
//
//   ASSIGN_OR_RETURN(CompletionRequest r, ParseCompletionRequest(body, model, seed));
//   CompletionBuilder b(model.tokenizer, "cmpl-1", created, "tiny", r);
//   std::string chunk = b.AddToken(token, /*chunk=*/true);   // one SSE event
//   std::string body = b.Response("stop");                   // non-stream body
//
// Errors are Status values that carry the HTTP shape: InvalidArgument ->
// 400, NotFound -> 404 (model_not_found), Unavailable -> 503; the offending
// request field rides along as a payload (ErrorParam), and ErrorJson renders
// OpenAI's {"error": {"message", "type", "param", "code"}}.
#ifndef DUET_ROUTER_COMPLETIONS_H_
#define DUET_ROUTER_COMPLETIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "proto/control.pb.h"

namespace duet::router {

// What validation needs to know about the served model.
struct ServedModel {
  std::string name;                               // The "model" clients must send.
  const engine::Tokenizer* tokenizer = nullptr;   // Not owned.
  const engine::PromptFormat* format = nullptr;   // Not owned.
  int64_t max_model_len = 0;                      // Context in tokens.
  // Token ids a prompt may hold: the model's embedding rows (config.json's
  // vocab_size), which may exceed the tokenizer's; 0: the tokenizer's.
  int64_t vocab_size = 0;
};

struct CompletionRequest {
  proto::GenerationSpec spec;  // prompt_ids, sampling (seed filled), max_tokens, ignore_eos.
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
  int logprobs = -1;           // -1: "logprobs": null; else top-N per token.
};

inline constexpr int kDefaultMaxTokens = 16;
inline constexpr int kMaxLogprobs = 20;

// Validates a /v1/completions body. `default_seed` is used when the body
// has no "seed" (the router passes a random one).
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body, const ServedModel& model,
                                                         uint64_t default_seed);

// Errors in the API's terms.
absl::Status ParamError(absl::string_view param, absl::string_view message);
std::string ErrorParam(const absl::Status& status);  // "" when none.
int HttpStatusFor(const absl::Status& status);
// OpenAI's error object, {"error": {...}}, for a non-OK status.
std::string ErrorJson(const absl::Status& status);

// Accumulates one choice's tokens and renders them.
class CompletionBuilder {
 public:
  CompletionBuilder(const engine::Tokenizer* tokenizer, std::string id, int64_t created,
                    std::string model, int logprobs, int64_t prompt_tokens);

  // Adds a generated token. Returns its SSE chunk's JSON when `chunk`.
  std::string AddToken(const proto::Token& token, bool chunk);
  // The last stream chunk: any text still held back, and finish_reason.
  std::string FinalChunk(absl::string_view finish_reason);
  // The stream_options.include_usage chunk (empty choices, usage).
  std::string UsageChunk();
  // The whole non-stream response body.
  std::string Response(absl::string_view finish_reason);

  const std::vector<int32_t>& token_ids() const { return ids_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

 private:
  std::string ChunkJson(const std::string& text, const std::vector<int32_t>& ids, size_t lp_begin,
                        std::optional<absl::string_view> finish_reason, bool with_logprobs);
  std::string TokenText(int32_t id) const;

  const engine::Tokenizer* tokenizer_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const int logprobs_;
  const int64_t prompt_tokens_;
  engine::IncrementalDetokenizer detok_;
  std::string text_;
  int64_t text_chars_ = 0;  // Code points in text_ (OpenAI offsets count characters).
  bool finished_ = false;
  std::vector<int32_t> ids_;
  // Logprobs, one entry per token.
  std::vector<std::string> lp_tokens_;
  std::vector<float> lp_values_;
  std::vector<std::vector<std::pair<std::string, float>>> lp_top_;
  std::vector<int64_t> lp_offsets_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_COMPLETIONS_H_

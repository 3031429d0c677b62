// Chat templates: a conversation rendered into the prompt text a model was
// trained on, by the model's own tokenizer_config.json "chat_template"
// through duet's Jinja engine (text/jinja), as transformers renders it.
//
//   ASSIGN_OR_RETURN(PromptFormat pf, PromptFormat::Load(model_dir));
//   ASSIGN_OR_RETURN(std::string text, pf.RenderChat(messages, /*add_generation_prompt=*/true));
//
// The template sees `messages`, `add_generation_prompt`, the tokens of the
// config (bos_token, eos_token, unk_token, pad_token), `tools` and
// `documents` when the request has them, and the request's
// chat_template_kwargs. A message shows `role` and
// `content`, and `name`, `tool_call_id` and `tool_calls` when set; each
// call as {"id", "type": "function", "function": {"name", "arguments"}}
// with the arguments parsed into a mapping, as vLLM hands them to
// templates. A template that uses what the engine does not support is
// no error at load: the model still serves completions (for which BOS is
// added when add_bos_token says so), and chat gets an error naming the
// construct and its line.
#ifndef DUET_ENGINE_CHAT_TEMPLATE_H_
#define DUET_ENGINE_CHAT_TEMPLATE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/jinja/template.h"

namespace duet::text {

// A function call an assistant message made (OpenAI's tool_calls[k]).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as the API carries it
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ToolCall> tool_calls;  // An assistant's calls.
  std::string tool_call_id;          // A tool message: the call it answers.
  std::string name;                  // The author's name, when given.
  // An assistant's thinking, when given: the template sees it as
  // message.reasoning_content (Qwen3's and DeepSeek-R1's templates render it).
  std::optional<std::string> reasoning;
};

// A retrieved document (vLLM's `documents`): its text, and an id and title
// when known.
struct ChatDocument {
  std::string id, title, text;
};

class PromptFormat {
 public:
  // Reads DIR/tokenizer_config.json. A missing file or a missing template is
  // fine (no chat); a malformed file or an unknown template is an error.
  static absl::StatusOr<PromptFormat> Load(const std::string& model_dir);
  // From the file's text; `source` names it in errors.
  static absl::StatusOr<PromptFormat> FromTokenizerConfig(const std::string& json_text,
                                                          const std::string& source);

  bool has_chat_template() const { return template_ != nullptr; }
  // Why chat is unavailable ("" when it is available).
  const std::string& chat_unavailable() const { return template_error_; }
  // FailedPrecondition naming the file when there is no chat template (or
  // one duet cannot render); InvalidArgument for an unknown role, an empty
  // conversation, or a template's own error (raise_exception, a type error),
  // with its line.
  //
  // Documents: a template that reads `documents` gets them as a list of
  // {"id", "title", "text"} (id and title only when given) and no starts are
  // reported. Otherwise duet's fallback: each document becomes a system
  // message whose content is "Document <id, or its 1-based index>[:
  // <title>]", a newline and the text, after the leading system message
  // (first when there is none), in order, rendered by the template; if the
  // template refuses that (it may allow only one system message), the
  // documents' texts are appended to the leading system message (or make
  // one). `document_starts`, when given, receives the offset where each
  // document's turn starts and one where what follows the last begins, when
  // each is where the template's text of the messages before it ends and
  // just before one of the config's special tokens (so the pieces between
  // them tokenize as they do in the whole); else nothing.
  //
  // `tools`: the request's tool definitions (a JSON array), or null.
  // `variables`: more variables for the template (a JSON object, or null),
  // as a request's chat_template_kwargs gives them (Qwen3's
  // enable_thinking); the ones above win where a name is both.
  absl::StatusOr<std::string> RenderChat(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                         absl::Span<const ChatDocument> documents = {},
                                         std::vector<size_t>* document_starts = nullptr,
                                         const nlohmann::ordered_json& tools = nullptr,
                                         const nlohmann::ordered_json& variables = nullptr) const;
  // The text a plain completion prompt starts with: the BOS token when
  // add_bos_token is true, else nothing.
  std::string CompletionPrefix() const { return add_bos_token_ ? bos_token_ : ""; }

  // The template's source text, and the config's tokens as it sees them
  // (bos_token, eos_token, unk_token, pad_token, each when set).
  const std::string& chat_template_source() const { return template_source_; }
  // The template reads `tools` (it can show a model the functions it may call).
  bool reads_tools() const { return reads_tools_; }
  const jinja::Value& template_tokens() const { return tokens_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }

 private:
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                     absl::Span<const ChatDocument> documents, const jinja::Value& tools,
                                     const jinja::Value& variables) const;
  bool StartsWithSpecial(absl::string_view text) const;

  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
  std::string template_source_;
  bool reads_documents_ = false;  // the template reads `documents` itself
  bool reads_tools_ = false;
  std::string template_error_;  // Why chat is unavailable, when it is.
  std::string bos_token_, eos_token_;
  jinja::Value tokens_ = jinja::Value::MakeObject();  // the config's tokens, as the template sees them
  std::vector<std::string> special_tokens_;           // added_tokens_decoder's special ones
  bool add_bos_token_ = false;
};

}  // namespace duet::text

#endif  // DUET_ENGINE_CHAT_TEMPLATE_H_

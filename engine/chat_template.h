// Chat templates: a conversation rendered into the prompt text a model was
// trained on, as its tokenizer_config.json's "chat_template" says.
//
//   ASSIGN_OR_RETURN(PromptFormat pf, PromptFormat::Load(model_dir));
//   ASSIGN_OR_RETURN(std::string text, pf.RenderChat(messages, /*add_generation_prompt=*/true));
//
// duet renders two families natively, recognised by their exact template
// text: Llama-3 (header tokens, <|eot_id|>, BOS in the template) and ChatML
// (Qwen2: <|im_start|>/<|im_end|>, default system prompt). Any other template
// is an error naming the file (there is no Jinja engine); a model without a
// template still serves plain completions, for which BOS is added when
// tokenizer_config.json's add_bos_token says so.
#ifndef DUET_ENGINE_CHAT_TEMPLATE_H_
#define DUET_ENGINE_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/chat_templates.h"

namespace duet::engine {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
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

  bool has_chat_template() const { return format_.has_value(); }
  // FailedPrecondition naming the file when there is no chat template (or
  // the template is not one duet renders); InvalidArgument for an unknown
  // role or an empty conversation.
  //
  // Documents come after the leading system message (ChatML's default one
  // when there is none; with Llama-3 and no system message, right after
  // BOS), in the given order, each a system turn of its own whose content
  // is "Document <id, or its 1-based index>[: <title>]", a newline and the
  // text. `document_starts`, when given, receives the offset in the text
  // where each document's turn starts and one where what follows the last
  // begins (nothing without documents): each is just before a special
  // token, so the pieces between them tokenize as they do in the whole.
  absl::StatusOr<std::string> RenderChat(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                         absl::Span<const ChatDocument> documents = {},
                                         std::vector<size_t>* document_starts = nullptr) const;
  // The text a plain completion prompt starts with: the BOS token when
  // add_bos_token is true, else nothing.
  std::string CompletionPrefix() const { return add_bos_token_ ? bos_token_ : ""; }

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }
  std::optional<ChatFormat> format() const { return format_; }

 private:
  std::string source_;
  std::optional<ChatFormat> format_;
  std::string template_error_;  // Why chat is unavailable, when it is.
  std::string bos_token_, eos_token_;
  bool add_bos_token_ = false;
};

}  // namespace duet::engine

#endif  // DUET_ENGINE_CHAT_TEMPLATE_H_

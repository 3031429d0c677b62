// Chat formats duet knows, and the exact Jinja chat templates their model
// families ship in tokenizer_config.json.
//
// `duet make-model` writes these templates into synthetic model directories;
// the serving path recognises a loaded model's template by comparing it with
// these constants byte for byte, so they must stay identical to upstream.
//
//   std::vector<std::string> specials = SpecialTokensFor(ChatFormat::kChatML);
//   bool is_llama3 = config["chat_template"] == kLlama3ChatTemplate;
#ifndef DUET_ENGINE_CHAT_TEMPLATES_H_
#define DUET_ENGINE_CHAT_TEMPLATES_H_

#include <string>
#include <vector>

namespace duet::text {

enum class ChatFormat {
  kLlama3,  // Meta-Llama-3-8B-Instruct: header tokens, <|eot_id|>, BOS.
  kChatML,  // Qwen2-7B-Instruct: <|im_start|> / <|im_end|>, no BOS.
};

// "chat_template" of meta-llama/Meta-Llama-3-8B-Instruct.
inline constexpr char kLlama3ChatTemplate[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// "chat_template" of Qwen/Qwen2-7B-Instruct.
inline constexpr char kChatMLChatTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] "
    "!= 'system' %}{{ '<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] "
    "+ '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// The special tokens a tokenizer for `format` needs, in the id order the
// real family uses (ids relative to the first special token).
inline std::vector<std::string> SpecialTokensFor(ChatFormat format) {
  switch (format) {
    case ChatFormat::kLlama3:
      return {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
              "<|end_header_id|>", "<|eot_id|>"};
    case ChatFormat::kChatML:
      return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  }
  return {};
}

}  // namespace duet::text

#endif  // DUET_ENGINE_CHAT_TEMPLATES_H_

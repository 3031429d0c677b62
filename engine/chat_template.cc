#include "engine/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace duet::engine {
namespace {

using nlohmann::json;

// A token field is a string or an AddedToken object {"content": ...}.
std::string TokenField(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

// Jinja's `trim`: strips leading and trailing whitespace.
std::string Trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

absl::StatusOr<PromptFormat> PromptFormat::FromTokenizerConfig(const std::string& text,
                                                               const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid JSON object"));
  }
  PromptFormat pf;
  pf.source_ = source;
  pf.bos_token_ = TokenField(j, "bos_token");
  pf.eos_token_ = TokenField(j, "eos_token");
  if (auto it = j.find("add_bos_token"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": field \"add_bos_token\" must be a boolean"));
    }
    pf.add_bos_token_ = it->get<bool>();
  }
  if (pf.add_bos_token_ && pf.bos_token_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": add_bos_token is true but \"bos_token\" is not set"));
  }
  auto ct = j.find("chat_template");
  if (ct == j.end() || ct->is_null()) {
    pf.template_error_ = absl::StrCat(source, " has no \"chat_template\"");
    return pf;
  }
  std::string tmpl;
  if (ct->is_string()) {
    tmpl = ct->get<std::string>();
  } else if (ct->is_array()) {
    // Named templates: the "default" one serves chat.
    for (const auto& t : *ct) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        tmpl = t["template"].get<std::string>();
      }
    }
    if (tmpl.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": \"chat_template\" list has no \"default\" entry"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field \"chat_template\" must be a string or a list"));
  }
  if (tmpl == kLlama3ChatTemplate) {
    pf.format_ = ChatFormat::kLlama3;
  } else if (tmpl == kChatMLChatTemplate) {
    pf.format_ = ChatFormat::kChatML;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": its \"chat_template\" is not one duet can render (supported: the Llama-3 "
                "and ChatML/Qwen2 templates; there is no general Jinja engine)"));
  }
  return pf;
}

absl::StatusOr<PromptFormat> PromptFormat::Load(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    PromptFormat pf;
    pf.source_ = path;
    pf.template_error_ = absl::StrCat(model_dir, " has no tokenizer_config.json");
    return pf;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return FromTokenizerConfig(ss.str(), path);
}

absl::StatusOr<std::string> PromptFormat::RenderChat(absl::Span<const ChatMessage> messages,
                                                     bool add_generation_prompt,
                                                     absl::Span<const ChatDocument> documents,
                                                     std::vector<size_t>* document_starts) const {
  if (!format_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("this model cannot chat: ", template_error_,
                                                      "; use plain completions"));
  }
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role \"", r,
                                                     "\" must be system, user or assistant"));
    }
  }
  if (document_starts != nullptr) document_starts->clear();
  std::string out;
  auto turn = [&](const std::string& role, const std::string& content) {
    switch (*format_) {
      case ChatFormat::kLlama3:
        absl::StrAppend(&out, "<|start_header_id|>", role, "<|end_header_id|>\n\n", Trim(content), "<|eot_id|>");
        break;
      case ChatFormat::kChatML:
        absl::StrAppend(&out, "<|im_start|>", role, "\n", content, "<|im_end|>\n");
        break;
    }
  };
  if (*format_ == ChatFormat::kLlama3) out += bos_token_;
  size_t next = 0;  // The first message not yet rendered.
  if (messages[0].role == "system") {
    turn("system", messages[0].content);
    next = 1;
  } else if (*format_ == ChatFormat::kChatML) {
    turn("system", "You are a helpful assistant.");
  }
  for (size_t d = 0; d < documents.size(); ++d) {
    if (document_starts != nullptr) document_starts->push_back(out.size());
    const ChatDocument& doc = documents[d];
    turn("system", absl::StrCat("Document ", doc.id.empty() ? absl::StrCat(d + 1) : doc.id,
                                doc.title.empty() ? "" : absl::StrCat(": ", doc.title), "\n", doc.text));
  }
  if (document_starts != nullptr && !documents.empty()) document_starts->push_back(out.size());
  for (size_t i = next; i < messages.size(); ++i) turn(messages[i].role, messages[i].content);
  if (add_generation_prompt) {
    out += *format_ == ChatFormat::kLlama3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                                           : "<|im_start|>assistant\n";
  }
  return out;
}

}  // namespace duet::engine

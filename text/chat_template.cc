#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace duet::text {
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
  for (const char* t : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = j.find(t);
    if (it != j.end() && !it->is_null()) pf.tokens_.mutable_object().Set(t, jinja::Value::String(TokenField(j, t)));
  }
  if (auto it = j.find("added_tokens_decoder"); it != j.end() && it->is_object()) {
    for (const auto& [id, tok] : it->items()) {
      if (tok.is_object() && tok.value("special", false) && tok.contains("content") && tok["content"].is_string() &&
          !tok["content"].get<std::string>().empty()) {
        pf.special_tokens_.push_back(tok["content"].get<std::string>());
      }
    }
  }
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
  pf.template_source_ = tmpl;
  absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(tmpl);
  if (!parsed.ok()) {
    pf.template_error_ = absl::StrCat(source, ": its \"chat_template\" cannot be rendered: ", parsed.status().message());
    return pf;
  }
  pf.reads_documents_ = parsed->Reads("documents");
  pf.reads_tools_ = parsed->Reads("tools");
  pf.template_ = std::make_shared<const jinja::Template>(std::move(*parsed));
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

bool PromptFormat::StartsWithSpecial(absl::string_view text) const {
  for (const std::string& t : special_tokens_) {
    if (absl::StartsWith(text, t)) return true;
  }
  return false;
}

absl::StatusOr<std::string> PromptFormat::Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                                 absl::Span<const ChatDocument> documents, const jinja::Value& tools,
                                                 const jinja::Value& variables) const {
  jinja::Value ctx = jinja::Value::MakeObject();
  // The request's variables first: what the template is always given wins.
  if (!variables.is_undefined()) {
    for (const auto& [k, v] : variables.object().items) ctx.mutable_object().Set(k, v);
  }
  for (const auto& [k, v] : tokens_.object().items) ctx.mutable_object().Set(k, v);
  jinja::List list;
  for (const ChatMessage& m : messages) {
    jinja::Value msg = jinja::Value::MakeObject();
    msg.mutable_object().Set("role", jinja::Value::String(m.role));
    msg.mutable_object().Set("content", jinja::Value::String(m.content));
    if (!m.name.empty()) msg.mutable_object().Set("name", jinja::Value::String(m.name));
    if (!m.tool_call_id.empty()) msg.mutable_object().Set("tool_call_id", jinja::Value::String(m.tool_call_id));
    if (m.reasoning) msg.mutable_object().Set("reasoning_content", jinja::Value::String(*m.reasoning));
    if (!m.tool_calls.empty()) {
      jinja::List calls;
      for (const ToolCall& c : m.tool_calls) {
        jinja::Value fn = jinja::Value::MakeObject();
        fn.mutable_object().Set("name", jinja::Value::String(c.name));
        json args = json::parse(c.arguments, nullptr, false);
        fn.mutable_object().Set("arguments", args.is_discarded() ? jinja::Value::String(c.arguments)
                                                                 : jinja::Value::FromJson(args));
        jinja::Value call = jinja::Value::MakeObject();
        call.mutable_object().Set("id", jinja::Value::String(c.id));
        call.mutable_object().Set("type", jinja::Value::String("function"));
        call.mutable_object().Set("function", std::move(fn));
        calls.push_back(std::move(call));
      }
      msg.mutable_object().Set("tool_calls", jinja::Value::MakeList(std::move(calls)));
    }
    list.push_back(std::move(msg));
  }
  ctx.mutable_object().Set("messages", jinja::Value::MakeList(std::move(list)));
  ctx.mutable_object().Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  if (!tools.is_undefined()) ctx.mutable_object().Set("tools", tools);
  if (!documents.empty()) {
    jinja::List docs;
    for (const ChatDocument& d : documents) {
      jinja::Value doc = jinja::Value::MakeObject();
      if (!d.id.empty()) doc.mutable_object().Set("id", jinja::Value::String(d.id));
      if (!d.title.empty()) doc.mutable_object().Set("title", jinja::Value::String(d.title));
      doc.mutable_object().Set("text", jinja::Value::String(d.text));
      docs.push_back(std::move(doc));
    }
    ctx.mutable_object().Set("documents", jinja::Value::MakeList(std::move(docs)));
  }
  absl::StatusOr<std::string> out = template_->Render(ctx);
  if (!out.ok()) return absl::InvalidArgumentError(absl::StrCat("the chat template: ", out.status().message()));
  return out;
}

absl::StatusOr<std::string> PromptFormat::RenderChat(absl::Span<const ChatMessage> messages,
                                                     bool add_generation_prompt,
                                                     absl::Span<const ChatDocument> documents,
                                                     std::vector<size_t>* document_starts,
                                                     const nlohmann::ordered_json& tools_json,
                                                     const nlohmann::ordered_json& variables_json) const {
  if (template_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("this model cannot chat: ", template_error_,
                                                      "; use plain completions"));
  }
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role \"", r,
                                                     "\" must be system, user, assistant or tool"));
    }
  }
  const jinja::Value tools = tools_json.is_null() ? jinja::Value() : jinja::Value::FromJson(tools_json);
  const jinja::Value variables = variables_json.is_null() ? jinja::Value() : jinja::Value::FromJson(variables_json);
  if (document_starts != nullptr) document_starts->clear();
  if (documents.empty() || reads_documents_) {
    return Render(messages, add_generation_prompt, documents, tools, variables);
  }

  // duet's fallback: each document a system message after the leading one.
  const size_t first = messages[0].role == "system" ? 1 : 0;
  std::vector<ChatMessage> with_docs(messages.begin(), messages.begin() + first);
  for (size_t d = 0; d < documents.size(); ++d) {
    const ChatDocument& doc = documents[d];
    with_docs.push_back({"system", absl::StrCat("Document ", doc.id.empty() ? absl::StrCat(d + 1) : doc.id,
                                                doc.title.empty() ? "" : absl::StrCat(": ", doc.title), "\n",
                                                doc.text)});
  }
  with_docs.insert(with_docs.end(), messages.begin() + first, messages.end());
  absl::StatusOr<std::string> text = Render(with_docs, add_generation_prompt, {}, tools, variables);
  if (!text.ok()) {
    // The template takes one system message: the documents join it.
    std::vector<ChatMessage> joined(messages.begin(), messages.end());
    if (first == 0) joined.insert(joined.begin(), {"system", ""});
    for (size_t d = 0; d < documents.size(); ++d) {
      absl::StrAppend(&joined[0].content, joined[0].content.empty() ? "" : "\n\n", with_docs[first + d].content);
    }
    return Render(joined, add_generation_prompt, {}, tools, variables);
  }
  if (document_starts == nullptr) return text;
  // Each document's turn starts where the text of the messages before it
  // ends, when that is a prefix of the whole just before a special token.
  std::vector<size_t> starts;
  for (size_t k = first; k <= first + documents.size(); ++k) {
    absl::StatusOr<std::string> prefix =
        k == 0 ? absl::StatusOr<std::string>(std::string())
               : Render(absl::MakeConstSpan(with_docs).subspan(0, k), false, {}, tools, variables);
    if (prefix.ok() && prefix->empty()) continue;  // the prompt's own start
    if (!prefix.ok() || !absl::StartsWith(*text, *prefix) ||
        !StartsWithSpecial(absl::string_view(*text).substr(prefix->size())) ||
        (!starts.empty() && prefix->size() <= starts.back())) {
      return text;  // no starts: the template's turns are not separable here
    }
    starts.push_back(prefix->size());
  }
  *document_starts = std::move(starts);
  return text;
}

}  // namespace duet::text

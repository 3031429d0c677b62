#include "grammar/constraint.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "grammar/gbnf.h"

namespace duet::grammar {

using json = nlohmann::ordered_json;

std::string ToolCallsText(const ToolCallsShape& shape) {
  json j;
  json tools = json::array();
  for (const ToolSchema& t : shape.tools) tools.push_back({{"name", t.name}, {"parameters", t.parameters}});
  j["tools"] = std::move(tools);
  j["named"] = shape.named;
  j["open"] = shape.open;
  j["name_close"] = shape.name_close;
  j["close"] = shape.close;
  j["next_open"] = shape.next_open;
  return CompactJson(j);
}

namespace {

absl::StatusOr<ToolCallsShape> ParseToolCallsText(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  if (!j.is_object() || !j.contains("tools") || !j["tools"].is_array()) {
    return absl::InvalidArgumentError("tools: the tool calls' shape is not {\"tools\": [...], ...}");
  }
  ToolCallsShape s;
  for (const json& t : j["tools"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
      return absl::InvalidArgumentError("tools: a tool without a name");
    }
    s.tools.push_back({t["name"].get<std::string>(), t.contains("parameters") ? t["parameters"] : json()});
  }
  s.named = str("named");
  s.open = str("open");
  s.name_close = str("name_close");
  s.close = str("close");
  s.next_open = str("next_open");
  return s;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const ConstraintRequest& r,
                                                                 std::shared_ptr<const Vocabulary> vocab) {
  CompileOptions options;
  options.whitespace = r.whitespace;
  switch (r.kind) {
    case ConstraintKind::kNone:
      return absl::InvalidArgumentError("no grammar to compile");
    case ConstraintKind::kJsonSchema:
      return CompileJsonSchemaText(r.text, std::move(vocab), options);
    case ConstraintKind::kRegex:
      return CompileRegexGrammar(r.text, std::move(vocab));
    case ConstraintKind::kChoice:
      return CompileChoiceGrammar(r.choices, std::move(vocab));
    case ConstraintKind::kGrammar:
      // Told apart by syntax: GBNF defines its rules with `::=`.
      if (r.text.find("::=") != std::string::npos) return CompileGbnf(r.text, std::move(vocab));
      return CompileLark(r.text, std::move(vocab));
    case ConstraintKind::kToolCalls: {
      ASSIGN_OR_RETURN(ToolCallsShape shape, ParseToolCallsText(r.text));
      return CompileToolCalls(shape, std::move(vocab));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("grammar kind ", static_cast<int>(r.kind), " is not known"));
}

absl::StatusOr<std::shared_ptr<const Grammar>> GrammarCache::Get(const ConstraintRequest& r) {
  // Triggers only decide where a sequence starts its grammar: not part of it.
  std::string key = absl::StrCat(static_cast<int>(r.kind), r.whitespace ? "w" : "c", r.text.size(), ":", r.text);
  for (const std::string& c : r.choices) absl::StrAppend(&key, "\n", c.size(), ":", c);
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: two requests racing on a new text both
  // compile it, and the second's copy is the one kept.
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, CompileConstraint(r, vocab_));
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) lru_.erase(it->second);
  lru_.emplace_front(key, g);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

size_t GrammarCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

absl::StatusOr<GrammarCache*> LazyGrammarCache::Get() {
  absl::MutexLock lock(&mu_);
  if (cache_ == nullptr) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Vocabulary> vocab, make_());
    cache_ = std::make_unique<GrammarCache>(std::move(vocab), capacity_);
  }
  return cache_.get();
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::vector<std::string> triggers)
    : matcher_(std::move(grammar)), triggers_(std::move(triggers)) {
  // An empty trigger is met at once.
  while (next_trigger_ < triggers_.size() && triggers_[next_trigger_].empty()) ++next_trigger_;
}

bool TokenConstraint::Accept(int32_t token) {
  if (broken_) return false;
  const Vocabulary& vocab = matcher_.grammar().vocab();
  if (started()) {
    if (!matcher_.AcceptToken(token)) {
      broken_ = true;
    } else {
      const std::vector<int32_t>& eos = vocab.eos_ids();
      ended_ = ended_ || std::find(eos.begin(), eos.end(), token) != eos.end();
    }
    return !broken_;
  }
  tail_ += vocab.text(token);
  while (!started()) {
    const std::string& t = triggers_[next_trigger_];
    const size_t at = tail_.find(t);
    if (at == std::string::npos) {
      // Keep what may still begin it.
      if (tail_.size() >= t.size()) tail_.erase(0, tail_.size() - (t.size() - 1));
      return true;
    }
    tail_.erase(0, at + t.size());
    ++next_trigger_;
  }
  // Started within this token: what followed the trigger in it is the
  // grammar's first text.
  if (!tail_.empty() && !matcher_.AcceptBytes(tail_)) broken_ = true;
  tail_.clear();
  return !broken_;
}

absl::Span<const uint64_t> TokenConstraint::Mask() {
  if (!started()) return {};
  mask_.resize(matcher_.grammar().vocab().mask_words());
  if (broken_) {
    std::fill(mask_.begin(), mask_.end(), 0);
  } else {
    matcher_.FillMask(mask_.data());
  }
  return mask_;
}

}  // namespace duet::grammar

#include "router/completions.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::router {

using Json = nlohmann::ordered_json;

namespace {

constexpr char kParamPayload[] = "duet.router/param";
constexpr char kCodePayload[] = "duet.router/code";

absl::Status WithPayloads(absl::Status s, absl::string_view param, absl::string_view code) {
  if (!param.empty()) s.SetPayload(kParamPayload, absl::Cord(param));
  if (!code.empty()) s.SetPayload(kCodePayload, absl::Cord(code));
  return s;
}

std::string Describe(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// A float as JSON prints it shortest: -0.1f becomes -0.1, not -0.10000000149.
Json FloatJson(float f) {
  if (!std::isfinite(f)) return f < 0 ? Json(-9999.0) : Json(nullptr);  // -inf logprob: vLLM's floor.
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  return Json(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
}

int64_t CountChars(absl::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Reads an optional field; `null` counts as absent.
const Json* Field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetInt(const Json& body, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  const Json* v = Field(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_integer()) {
    return ParamError(name, absl::StrCat("'", name, "' must be an integer, got ", Describe(*v)));
  }
  // Unsigned values above int64 arrive as number_unsigned.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return ParamError(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", Describe(*v)));
  }
  int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    return ParamError(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  }
  *out = x;
  return absl::OkStatus();
}

// `open_lo`: the range excludes lo.
absl::Status GetNumber(const Json& body, const char* name, double lo, double hi, bool open_lo, double* out) {
  const Json* v = Field(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) {
    return ParamError(name, absl::StrCat("'", name, "' must be a number, got ", Describe(*v)));
  }
  double x = v->get<double>();
  if (!std::isfinite(x) || x > hi || (open_lo ? x <= lo : x < lo)) {
    return ParamError(name, absl::StrCat("'", name, "' must be in ", open_lo ? "(" : "[", lo, ", ", hi,
                                         "], got ", Describe(*v)));
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status GetBool(const Json& body, const char* name, bool* out) {
  const Json* v = Field(body, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) {
    return ParamError(name, absl::StrCat("'", name, "' must be a boolean, got ", Describe(*v)));
  }
  *out = v->get<bool>();
  return absl::OkStatus();
}

int64_t VocabSize(const ServedModel& model) {
  return model.vocab_size > 0 ? model.vocab_size : model.tokenizer->vocab_size();
}

bool IsTokenArray(const Json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const Json& e : v) {
    if (!e.is_number_integer()) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const Json& body, const ServedModel& model) {
  const Json* p = Field(body, "prompt");
  if (p == nullptr) return ParamError("prompt", "'prompt' is required");
  const Json* prompt = p;
  if (p->is_array() && !p->empty() && !IsTokenArray(*p)) {
    // A list of prompts (strings or token lists): one is fine, more is a batch.
    if (p->size() > 1) {
      return ParamError("prompt", absl::StrCat("a batch of ", p->size(),
                                               " prompts is not supported; send one prompt per request"));
    }
    prompt = &(*p)[0];
  }
  std::vector<int32_t> ids;
  if (prompt->is_string()) {
    auto encoded = model.tokenizer->Encode(model.format->CompletionPrefix() + prompt->get<std::string>());
    if (!encoded.ok()) return ParamError("prompt", encoded.status().message());
    ids = std::move(*encoded);
  } else if (IsTokenArray(*prompt)) {
    const int64_t vocab = VocabSize(model);
    for (size_t i = 0; i < prompt->size(); ++i) {
      const Json& e = (*prompt)[i];
      const bool negative = e.is_number_integer() && !e.is_number_unsigned() && e.get<int64_t>() < 0;
      if (negative || e.get<uint64_t>() >= static_cast<uint64_t>(vocab)) {
        return ParamError("prompt", absl::StrCat("prompt[", i, "] = ", Describe(e),
                                                 " is not a token id (the vocabulary has ", vocab, ")"));
      }
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
  } else {
    return ParamError("prompt", absl::StrCat("'prompt' must be a string or an array of token ids, got ",
                                             Describe(*prompt)));
  }
  if (ids.empty()) return ParamError("prompt", "the prompt is empty");
  if (static_cast<int64_t>(ids.size()) >= model.max_model_len) {
    return ParamError("prompt", absl::StrCat("this model's maximum context length is ", model.max_model_len,
                                             " tokens, but the prompt has ", ids.size(),
                                             " tokens (at least one must be left for the completion)"));
  }
  return ids;
}

}  // namespace

absl::Status ParamError(absl::string_view param, absl::string_view message) {
  return WithPayloads(absl::InvalidArgumentError(message), param, "");
}

std::string ErrorParam(const absl::Status& status) {
  auto p = status.GetPayload(kParamPayload);
  return p ? std::string(*p) : "";
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorJson(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  Json err;
  err["message"] = std::string(status.message());
  err["type"] = http < 500 ? "invalid_request_error" : "server_error";
  std::string param = ErrorParam(status);
  err["param"] = param.empty() ? Json(nullptr) : Json(param);
  auto code = status.GetPayload(kCodePayload);
  if (code) {
    err["code"] = std::string(*code);
  } else if (http == 404) {
    err["code"] = "model_not_found";
  } else {
    err["code"] = nullptr;
  }
  Json out;
  out["error"] = std::move(err);
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view text, const ServedModel& model,
                                                         uint64_t default_seed) {
  Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return ParamError("", "the request body is not valid JSON");
  if (!body.is_object()) return ParamError("", "the request body must be a JSON object");

  const Json* m = Field(body, "model");
  if (m == nullptr) return ParamError("model", "'model' is required");
  if (!m->is_string()) return ParamError("model", absl::StrCat("'model' must be a string, got ", Describe(*m)));
  if (m->get<std::string>() != model.name) {
    return WithPayloads(absl::NotFoundError(absl::StrCat("The model `", m->get<std::string>(),
                                                         "` does not exist; this server serves `",
                                                         model.name, "`")),
                        "model", "model_not_found");
  }

  CompletionRequest r;
  int64_t max_tokens = kDefaultMaxTokens, top_k = 0, logprobs = -1, n = 1, min_tokens = 0, seed = 0;
  double temperature = 1, top_p = 1, min_p = 0, presence = 0, frequency = 0;
  bool echo = false, ignore_eos = false;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  RETURN_IF_ERROR(GetInt(body, "max_tokens", 1, kInt32Max, &max_tokens));
  RETURN_IF_ERROR(GetNumber(body, "temperature", 0, 2, false, &temperature));
  RETURN_IF_ERROR(GetNumber(body, "top_p", 0, 1, /*open_lo=*/true, &top_p));
  RETURN_IF_ERROR(GetInt(body, "top_k", -1, kInt32Max, &top_k));  // -1 and 0: off.
  RETURN_IF_ERROR(GetNumber(body, "min_p", 0, 1, false, &min_p));
  RETURN_IF_ERROR(GetInt(body, "logprobs", 0, kMaxLogprobs, &logprobs));
  if (const Json* v = Field(body, "seed"); v != nullptr) {
    if (!v->is_number_integer()) {
      return ParamError("seed", absl::StrCat("'seed' must be an integer, got ", Describe(*v)));
    }
    seed = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  }
  RETURN_IF_ERROR(GetNumber(body, "presence_penalty", -2, 2, false, &presence));
  RETURN_IF_ERROR(GetNumber(body, "frequency_penalty", -2, 2, false, &frequency));
  RETURN_IF_ERROR(GetBool(body, "stream", &r.stream));
  RETURN_IF_ERROR(GetBool(body, "ignore_eos", &ignore_eos));
  RETURN_IF_ERROR(GetBool(body, "echo", &echo));
  RETURN_IF_ERROR(GetInt(body, "n", 1, kInt32Max, &n));
  RETURN_IF_ERROR(GetInt(body, "min_tokens", 0, max_tokens, &min_tokens));
  if (n != 1) return ParamError("n", absl::StrCat("'n' = ", n, " is not supported; only 1 is"));
  if (echo) return ParamError("echo", "'echo' is not supported");
  if (const Json* stop = Field(body, "stop"); stop != nullptr && !(stop->is_array() && stop->empty())) {
    return ParamError("stop", "'stop' strings are not supported yet");
  }
  if (const Json* opts = Field(body, "stream_options"); opts != nullptr) {
    if (!opts->is_object()) {
      return ParamError("stream_options", absl::StrCat("'stream_options' must be an object, got ", Describe(*opts)));
    }
    RETURN_IF_ERROR(GetBool(*opts, "include_usage", &r.include_usage));
  }
  if (const Json* stops = Field(body, "stop_token_ids"); stops != nullptr) {
    if (!stops->is_array()) {
      return ParamError("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    }
    for (const Json& e : *stops) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= VocabSize(model)) {
        return ParamError("stop_token_ids", absl::StrCat("'stop_token_ids' has ", Describe(e),
                                                         ", which is not a token id"));
      }
      r.spec.add_stop_token_ids(static_cast<int32_t>(e.get<int64_t>()));
    }
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptIds(body, model));

  proto::GenerationSpec& spec = r.spec;
  spec.mutable_prompt_ids()->Assign(ids.begin(), ids.end());
  proto::SamplingParams& sp = *spec.mutable_sampling();
  sp.set_temperature(static_cast<float>(temperature));
  sp.set_top_k(top_k < 0 ? 0 : static_cast<int32_t>(top_k));
  sp.set_top_p(static_cast<float>(top_p));  // Proto zeros are literal: 1 means off.
  sp.set_min_p(static_cast<float>(min_p));
  sp.set_seed(Field(body, "seed") != nullptr ? static_cast<uint64_t>(seed) : default_seed);
  sp.set_logprobs(logprobs < 0 ? 0 : static_cast<int32_t>(logprobs));
  sp.set_presence_penalty(static_cast<float>(presence));
  sp.set_frequency_penalty(static_cast<float>(frequency));
  spec.set_max_tokens(static_cast<int32_t>(max_tokens));
  spec.set_ignore_eos(ignore_eos);
  spec.set_min_tokens(static_cast<int32_t>(min_tokens));
  spec.set_choice_index(0);
  r.logprobs = static_cast<int>(logprobs);
  return r;
}

CompletionBuilder::CompletionBuilder(const engine::Tokenizer* tokenizer, std::string id, int64_t created,
                                     std::string model, int logprobs, int64_t prompt_tokens)
    : tokenizer_(tokenizer),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      logprobs_(logprobs),
      prompt_tokens_(prompt_tokens),
      detok_(tokenizer, /*skip_special=*/true) {}

std::string CompletionBuilder::TokenText(int32_t id) const {
  auto text = tokenizer_->Decode(absl::MakeConstSpan(&id, 1));
  return text.ok() ? *text : "";
}

std::string CompletionBuilder::AddToken(const proto::Token& token, bool chunk) {
  const int32_t id = token.id();
  const int64_t offset = text_chars_;
  auto delta = detok_.Push(id);
  std::string piece = delta.ok() ? std::move(*delta) : "";
  text_ += piece;
  text_chars_ += CountChars(piece);
  ids_.push_back(id);
  const size_t lp_index = lp_tokens_.size();
  if (logprobs_ >= 0) {
    lp_tokens_.push_back(TokenText(id));
    lp_values_.push_back(token.logprob());
    std::vector<std::pair<std::string, float>> top;
    for (const proto::TopLogprob& t : token.top()) {
      if (static_cast<int>(top.size()) >= logprobs_) break;
      std::string key = TokenText(t.id());
      bool seen = false;
      for (const auto& [k, v] : top) seen |= k == key;
      if (!seen) top.emplace_back(std::move(key), t.logprob());
    }
    lp_top_.push_back(std::move(top));
    lp_offsets_.push_back(offset);
  }
  if (!chunk) return "";
  return ChunkJson(piece, {id}, lp_index, std::nullopt, logprobs_ >= 0);
}

std::string CompletionBuilder::ChunkJson(const std::string& text, const std::vector<int32_t>& ids,
                                         size_t lp_begin, std::optional<absl::string_view> finish_reason,
                                         bool with_logprobs) {
  Json choice;
  choice["index"] = 0;
  choice["text"] = text;
  if (with_logprobs) {
    Json lp;
    lp["tokens"] = Json::array();
    lp["token_logprobs"] = Json::array();
    lp["top_logprobs"] = Json::array();
    lp["text_offset"] = Json::array();
    for (size_t i = lp_begin; i < lp_tokens_.size(); ++i) {
      lp["tokens"].push_back(lp_tokens_[i]);
      lp["token_logprobs"].push_back(FloatJson(lp_values_[i]));
      Json top = Json::object();
      for (const auto& [k, v] : lp_top_[i]) top[k] = FloatJson(v);
      lp["top_logprobs"].push_back(std::move(top));
      lp["text_offset"].push_back(lp_offsets_[i]);
    }
    choice["logprobs"] = std::move(lp);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason ? Json(std::string(*finish_reason)) : Json(nullptr);
  choice["token_ids"] = ids;
  Json out;
  out["id"] = id_;
  out["object"] = "text_completion";
  out["created"] = created_;
  out["model"] = model_;
  out["choices"] = Json::array({std::move(choice)});
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string CompletionBuilder::FinalChunk(absl::string_view finish_reason) {
  std::string rest;
  if (!finished_) {
    rest = detok_.Finish();
    text_ += rest;
    finished_ = true;
  }
  return ChunkJson(rest, {}, lp_tokens_.size(), finish_reason, false);
}

namespace {

Json Usage(int64_t prompt, int64_t completion) {
  Json u;
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  return u;
}

}  // namespace

std::string CompletionBuilder::UsageChunk() {
  Json out;
  out["id"] = id_;
  out["object"] = "text_completion";
  out["created"] = created_;
  out["model"] = model_;
  out["choices"] = Json::array();
  out["usage"] = Usage(prompt_tokens_, static_cast<int64_t>(ids_.size()));
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string CompletionBuilder::Response(absl::string_view finish_reason) {
  if (!finished_) {
    text_ += detok_.Finish();
    finished_ = true;
  }
  Json choice;
  choice["index"] = 0;
  choice["text"] = text_;
  if (logprobs_ >= 0) {
    Json lp;
    lp["tokens"] = lp_tokens_;
    Json values = Json::array();
    for (float v : lp_values_) values.push_back(FloatJson(v));
    lp["token_logprobs"] = std::move(values);
    Json tops = Json::array();
    for (const auto& top : lp_top_) {
      Json t = Json::object();
      for (const auto& [k, v] : top) t[k] = FloatJson(v);
      tops.push_back(std::move(t));
    }
    lp["top_logprobs"] = std::move(tops);
    lp["text_offset"] = lp_offsets_;
    choice["logprobs"] = std::move(lp);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = std::string(finish_reason);
  choice["token_ids"] = ids_;
  Json out;
  out["id"] = id_;
  out["object"] = "text_completion";
  out["created"] = created_;
  out["model"] = model_;
  out["choices"] = Json::array({std::move(choice)});
  out["usage"] = Usage(prompt_tokens_, static_cast<int64_t>(ids_.size()));
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace duet::router

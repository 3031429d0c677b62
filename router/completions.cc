#include "router/completions.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "grammar/grammar_spec.h"

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

// A short description of a client's value for an error message. Never
// dumps a container: nesting is the client's to choose, and dump recurses.
std::string Describe(const Json& v) {
  if (v.is_array()) return absl::StrCat("an array of ", v.size());
  if (v.is_object()) return "an object";
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

// The context is a hard limit: a prompt must leave room for one token.
absl::Status CheckLength(size_t prompt_tokens, const ServedModel& model) {
  if (static_cast<int64_t>(prompt_tokens) >= model.max_model_len) {
    return ParamError("prompt", absl::StrCat("this model's maximum context length is ", model.max_model_len,
                                              " tokens, but the prompt has ", prompt_tokens,
                                              " tokens (at least one must be left for the completion)"));
  }
  return absl::OkStatus();
}

// One prompt of "prompt" (`where` names it in errors): a string or a list
// of token ids.
absl::StatusOr<std::vector<int32_t>> OnePrompt(const Json& prompt, const ServedModel& model, const std::string& where) {
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    auto encoded = model.tokenizer->Encode(model.format->CompletionPrefix() + prompt.get<std::string>());
    if (!encoded.ok()) return ParamError("prompt", encoded.status().message());
    ids = std::move(*encoded);
  } else if (IsTokenArray(prompt)) {
    const int64_t vocab = VocabSize(model);
    for (size_t i = 0; i < prompt.size(); ++i) {
      const Json& e = prompt[i];
      const bool negative = e.is_number_integer() && !e.is_number_unsigned() && e.get<int64_t>() < 0;
      if (negative || e.get<uint64_t>() >= static_cast<uint64_t>(vocab)) {
        return ParamError("prompt", absl::StrCat(where, "[", i, "] = ", Describe(e),
                                                 " is not a token id (the vocabulary has ", vocab, ")"));
      }
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
  } else {
    return ParamError("prompt", absl::StrCat("'", where, "' must be a string or an array of token ids, got ",
                                             Describe(prompt)));
  }
  if (ids.empty()) return ParamError("prompt", absl::StrCat(where == "prompt" ? "the prompt" : where, " is empty"));
  RETURN_IF_ERROR(CheckLength(ids.size(), model));
  return ids;
}

// "prompt": one prompt, or a list of them (a batch).
absl::StatusOr<std::vector<CompletionRequest::Prompt>> Prompts(const Json& body, const ServedModel& model,
                                                               bool echo) {
  const Json* p = Field(body, "prompt");
  if (p == nullptr) return ParamError("prompt", "'prompt' is required");
  std::vector<const Json*> prompts = {p};
  if (p->is_array() && !p->empty() && !IsTokenArray(*p)) {
    const bool any_id = std::any_of(p->begin(), p->end(), [](const Json& e) { return e.is_number(); });
    const bool any_other = std::any_of(p->begin(), p->end(), [](const Json& e) { return !e.is_number(); });
    if (any_id && any_other) {
      return ParamError("prompt",
                        "'prompt' mixes strings (or lists) and token ids; send a string, a list of token ids, or a "
                        "list of either");
    }
    if (p->size() > static_cast<size_t>(kMaxPrompts)) {
      return ParamError("prompt", absl::StrCat("a batch of ", p->size(), " prompts is more than the ", kMaxPrompts,
                                               " one request may hold"));
    }
    prompts.clear();
    for (const Json& e : *p) prompts.push_back(&e);
  }
  std::vector<CompletionRequest::Prompt> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string where = prompts.size() == 1 && prompts[0] == p ? "prompt" : absl::StrCat("prompt[", i, "]");
    CompletionRequest::Prompt one;
    ASSIGN_OR_RETURN(one.ids, OnePrompt(*prompts[i], model, where));
    if (echo) {
      if (prompts[i]->is_string()) {
        one.echo_text = prompts[i]->get<std::string>();
      } else {
        auto decoded = model.tokenizer->Decode(one.ids, /*skip_special=*/true);
        one.echo_text = decoded.ok() ? *decoded : "";
      }
    }
    out.push_back(std::move(one));
  }
  return out;
}

}  // namespace

absl::Status ParamError(absl::string_view param, absl::string_view message) {
  return WithPayloads(absl::InvalidArgumentError(message), param, "");
}

absl::Status WithCode(absl::Status status, absl::string_view code) {
  return WithPayloads(std::move(status), "", code);
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
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
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
  // As OpenAI's API: 401 is an invalid_request_error too (code
  // invalid_api_key); every 5xx a server_error.
  err["type"] = http == 429 ? "rate_limit_error" : http < 500 ? "invalid_request_error" : "server_error";
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

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::Status CheckModel(const Json& body, const ServedModel& model) {
  const Json* m = Field(body, "model");
  if (m == nullptr) return ParamError("model", "'model' is required");
  if (!m->is_string()) return ParamError("model", absl::StrCat("'model' must be a string, got ", Describe(*m)));
  if (m->get<std::string>() != model.name) {
    return WithPayloads(absl::NotFoundError(absl::StrCat("The model `", m->get<std::string>(),
                                                         "` does not exist; this server serves `",
                                                         model.name, "`")),
                        "model", "model_not_found");
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseBody(absl::string_view text) {
  // Depth is bounded by the HTTP body limit; nlohmann's parser is iterative
  // for arrays and objects, so hostile nesting costs memory, not stack.
  Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return ParamError("", "the request body is not valid JSON");
  if (!body.is_object()) return ParamError("", "the request body must be a JSON object");
  return body;
}

absl::StatusOr<std::vector<std::string>> StopStrings(const Json& body) {
  std::vector<std::string> out;
  const Json* stop = Field(body, "stop");
  if (stop == nullptr) return out;
  auto add = [&](const Json& e) -> absl::Status {
    if (!e.is_string()) {
      return ParamError("stop", absl::StrCat("'stop' must be a string or an array of strings, got ", Describe(e)));
    }
    const std::string& v = e.get_ref<const std::string&>();
    if (v.empty()) return ParamError("stop", "'stop' strings must not be empty");
    if (v.size() > static_cast<size_t>(kMaxStopBytes)) {
      return ParamError("stop", absl::StrCat("'stop' strings are at most ", kMaxStopBytes, " bytes"));
    }
    out.push_back(v);
    return absl::OkStatus();
  };
  if (stop->is_array()) {
    if (stop->size() > static_cast<size_t>(kMaxStop)) {
      return ParamError("stop", absl::StrCat("'stop' holds at most ", kMaxStop, " strings, got ", stop->size()));
    }
    for (const Json& e : *stop) RETURN_IF_ERROR(add(e));
  } else {
    RETURN_IF_ERROR(add(*stop));
  }
  return out;
}

// The sampling and length fields both APIs share.
absl::Status ParseCommon(const Json& body, const ServedModel& model, uint64_t default_seed, CompletionRequest& r) {
  // Chat without a length runs to the context's end (ParseChatRequest sets
  // it once the prompt's length is known), as OpenAI's and vLLM's chat do.
  int64_t max_tokens = r.kind == ApiKind::kChat ? kInt32Max : kDefaultMaxTokens;
  // The checkpoint's defaults (generation_config.json), then the request's.
  const spec::ModelConfig::SamplingDefaults& d = model.sampling_defaults;
  int64_t top_k = d.top_k.value_or(0), n = 1, min_tokens = 0, seed = 0;
  double temperature = d.temperature.value_or(1), top_p = d.top_p.value_or(1), min_p = d.min_p.value_or(0);
  double presence = 0, frequency = 0;
  bool ignore_eos = false;
  RETURN_IF_ERROR(GetInt(body, "max_tokens", 1, kInt32Max, &max_tokens));
  if (r.kind == ApiKind::kChat) {
    // The newer name wins where a client sends both.
    RETURN_IF_ERROR(GetInt(body, "max_completion_tokens", 1, kInt32Max, &max_tokens));
  }
  RETURN_IF_ERROR(GetNumber(body, "temperature", 0, 2, false, &temperature));
  RETURN_IF_ERROR(GetNumber(body, "top_p", 0, 1, /*open_lo=*/true, &top_p));
  RETURN_IF_ERROR(GetInt(body, "top_k", -1, kInt32Max, &top_k));  // -1 and 0: off.
  RETURN_IF_ERROR(GetNumber(body, "min_p", 0, 1, false, &min_p));
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
  RETURN_IF_ERROR(GetInt(body, "n", 1, kMaxChoices, &n));
  RETURN_IF_ERROR(GetInt(body, "min_tokens", 0, max_tokens, &min_tokens));
  if (const Json* u = Field(body, "user"); u != nullptr && !u->is_string()) {
    return ParamError("user", absl::StrCat("'user' must be a string, got ", Describe(*u)));
  }
  ASSIGN_OR_RETURN(r.stop, StopStrings(body));
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
      if (!e.is_number_integer() || (!e.is_number_unsigned() && e.get<int64_t>() < 0) ||
          e.get<uint64_t>() >= static_cast<uint64_t>(VocabSize(model))) {
        return ParamError("stop_token_ids", absl::StrCat("'stop_token_ids' has ", Describe(e),
                                                         ", which is not a token id"));
      }
      r.spec.add_stop_token_ids(static_cast<int32_t>(e.get<int64_t>()));
    }
  }
  proto::GenerationSpec& spec = r.spec;
  proto::SamplingParams& sp = *spec.mutable_sampling();
  sp.set_temperature(static_cast<float>(temperature));
  sp.set_top_k(top_k < 0 ? 0 : static_cast<int32_t>(top_k));
  sp.set_top_p(static_cast<float>(top_p));  // Proto zeros are literal: 1 means off.
  sp.set_min_p(static_cast<float>(min_p));
  sp.set_seed(Field(body, "seed") != nullptr ? static_cast<uint64_t>(seed) : default_seed);
  sp.set_presence_penalty(static_cast<float>(presence));
  sp.set_frequency_penalty(static_cast<float>(frequency));
  spec.set_max_tokens(static_cast<int32_t>(max_tokens));
  spec.set_ignore_eos(ignore_eos);
  spec.set_min_tokens(static_cast<int32_t>(min_tokens));
  spec.set_choice_index(0);
  r.n = static_cast<int>(n);
  return absl::OkStatus();
}

// ------------------------------------------------------- structured outputs

// A JSON Schema as a request sends it: an object (or boolean), or its JSON text.
absl::StatusOr<std::string> SchemaText(const Json& v, const std::string& where, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return grammar::CompactJson(v);
  if (v.is_string()) {
    Json parsed = Json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
      return ParamError(param, absl::StrCat(where, " is not a JSON Schema (an object, or its JSON text)"));
    }
    return grammar::CompactJson(parsed);
  }
  return ParamError(param, absl::StrCat(where, " must be a JSON Schema object, got ", Describe(v)));
}

absl::StatusOr<std::vector<std::string>> Choices(const Json& v, const std::string& where, const std::string& param) {
  if (!v.is_array()) return ParamError(param, absl::StrCat(where, " must be an array of strings, got ", Describe(v)));
  std::vector<std::string> out;
  for (const Json& e : v) {
    if (!e.is_string() || e.get<std::string>().empty()) {
      return ParamError(param, absl::StrCat(where, " must hold non-empty strings, got ", Describe(e)));
    }
    out.push_back(e.get<std::string>());
  }
  if (out.empty()) return ParamError(param, absl::StrCat(where, " is empty: there is nothing to choose"));
  return out;
}

absl::StatusOr<std::string> StringField(const Json& v, const std::string& where, const std::string& param) {
  if (!v.is_string()) return ParamError(param, absl::StrCat(where, " must be a string, got ", Describe(v)));
  return v.get<std::string>();
}

// One of the ways to ask for a grammar: `kind` from `v`, named `where` in
// errors.
absl::StatusOr<grammar::ConstraintRequest> GrammarOf(absl::string_view kind, const Json& v, const std::string& where,
                                                     const std::string& param) {
  grammar::ConstraintRequest g;
  if (kind == "json") {
    g.kind = grammar::ConstraintKind::kJsonSchema;
    ASSIGN_OR_RETURN(g.text, SchemaText(v, where, param));
  } else if (kind == "regex") {
    g.kind = grammar::ConstraintKind::kRegex;
    ASSIGN_OR_RETURN(g.text, StringField(v, where, param));
  } else if (kind == "choice") {
    g.kind = grammar::ConstraintKind::kChoice;
    ASSIGN_OR_RETURN(g.choices, Choices(v, where, param));
  } else if (kind == "grammar") {
    g.kind = grammar::ConstraintKind::kGrammar;
    ASSIGN_OR_RETURN(g.text, StringField(v, where, param));
  } else {  // json_object
    g.kind = grammar::ConstraintKind::kJsonSchema;
    g.text = R"({"type":"object"})";
  }
  return g;
}

// response_format, vLLM's structured_outputs, and its older guided_*
// fields: at most one of them asks for a grammar.
absl::Status ParseStructured(const Json& body, CompletionRequest& r) {
  std::vector<std::pair<std::string, grammar::ConstraintRequest>> asks;  // param, request
  if (const Json* rf = Field(body, "response_format"); rf != nullptr) {
    const Json* type = rf->is_object() ? Field(*rf, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return ParamError("response_format", "'response_format' must be an object with a string 'type'");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      asks.push_back({"response_format", *GrammarOf("json_object", nullptr, "", "")});
    } else if (t == "json_schema") {
      const Json* js = Field(*rf, "json_schema");
      if (js == nullptr || !js->is_object()) {
        return ParamError("response_format",
                          "response_format type 'json_schema' needs 'json_schema': {\"name\", \"schema\", \"strict\"}");
      }
      if (const Json* strict = Field(*js, "strict"); strict != nullptr && !strict->is_boolean()) {
        return ParamError("response_format", "response_format.json_schema.strict must be a boolean");
      }
      const Json* schema = Field(*js, "schema");
      // strict false is enforced all the same; no schema: any JSON value.
      ASSIGN_OR_RETURN(grammar::ConstraintRequest g,
                       GrammarOf("json", schema != nullptr ? *schema : Json::object(),
                                 "response_format.json_schema.schema", "response_format"));
      asks.push_back({"response_format", std::move(g)});
    } else if (t != "text") {
      return ParamError("response_format", absl::StrCat("response_format type '", t,
                                                        "' is not known: text, json_object or json_schema"));
    }
  }
  std::string whitespace_pattern;
  bool whitespace_set = false;
  if (const Json* so = Field(body, "structured_outputs"); so != nullptr) {
    if (!so->is_object()) {
      return ParamError("structured_outputs",
                        absl::StrCat("'structured_outputs' must be an object, got ", Describe(*so)));
    }
    if (Field(*so, "structural_tag") != nullptr) {
      return ParamError("structured_outputs", "structured_outputs.structural_tag is not supported");
    }
    for (const char* k : {"json", "regex", "choice", "grammar", "json_object"}) {
      const Json* v = Field(*so, k);
      if (v == nullptr) continue;
      if (std::string_view(k) == "json_object") {
        if (!v->is_boolean()) return ParamError("structured_outputs", "structured_outputs.json_object must be a boolean");
        if (!v->get<bool>()) continue;
      }
      ASSIGN_OR_RETURN(grammar::ConstraintRequest g,
                       GrammarOf(k, *v, absl::StrCat("structured_outputs.", k), "structured_outputs"));
      asks.push_back({"structured_outputs", std::move(g)});
    }
    if (const Json* w = Field(*so, "whitespace_pattern"); w != nullptr) {
      ASSIGN_OR_RETURN(whitespace_pattern,
                       StringField(*w, "structured_outputs.whitespace_pattern", "structured_outputs"));
      whitespace_set = true;
    }
    if (const Json* d = Field(*so, "disable_any_whitespace"); d != nullptr && d->is_boolean() && d->get<bool>()) {
      whitespace_pattern.clear();
      whitespace_set = true;
    }
  }
  for (const char* k : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    const Json* v = Field(body, k);
    if (v == nullptr) continue;
    ASSIGN_OR_RETURN(grammar::ConstraintRequest g, GrammarOf(absl::string_view(k).substr(7), *v, k, k));
    asks.push_back({k, std::move(g)});
  }
  if (const Json* w = Field(body, "guided_whitespace_pattern"); w != nullptr) {
    ASSIGN_OR_RETURN(whitespace_pattern, StringField(*w, "guided_whitespace_pattern", "guided_whitespace_pattern"));
    whitespace_set = true;
  }
  if (asks.size() > 1) {
    return ParamError(asks[1].first, absl::StrCat("the request asks for two output formats (", asks[0].first,
                                                  " and ", asks[1].first, "); send one"));
  }
  if (asks.empty()) return absl::OkStatus();
  r.grammar_param = asks[0].first;
  r.grammar = std::move(asks[0].second);
  // A whitespace pattern lets JSON hold whitespace between its tokens (up
  // to 16 characters of space, tab or newline in a row), not the pattern's own.
  if (whitespace_set) r.grammar->whitespace = !whitespace_pattern.empty();
  return absl::OkStatus();
}

// Compiles the request's grammar (its triggers set) to refuse here what the
// workers could not enforce, and puts it in the spec.
absl::Status FinishGrammar(const ServedModel& model, CompletionRequest& r) {
  if (!r.grammar) return absl::OkStatus();
  if (model.grammars == nullptr) return ParamError(r.grammar_param, "structured outputs are not available here");
  absl::StatusOr<grammar::GrammarCache*> cache = model.grammars->Get();
  if (!cache.ok()) return ParamError(r.grammar_param, cache.status().message());
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = (*cache)->Get(*r.grammar);
  if (!g.ok()) {
    const bool from_tools = r.grammar->kind == grammar::ConstraintKind::kToolCalls;
    return ParamError(r.grammar_param, from_tools ? g.status().message()
                                                  : absl::StrCat(r.grammar_param, ": ", g.status().message()));
  }
  *r.spec.mutable_grammar() = grammar::ToProto(*r.grammar);
  return absl::OkStatus();
}

// A tool's function name, as OpenAI allows it: 1-64 of [A-Za-z0-9_-].
bool IsFunctionName(absl::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// "tools", "tool_choice" and "parallel_tool_calls". `tools` gets the
// definitions the template renders (null when none, or tool_choice "none");
// r.tool_format the format calls are parsed in. required and a named
// function are enforced by ending the prompt with the opening of a call
// (the name too, when named); the arguments are the model's own.
absl::Status ParseTools(const Json& body, const ServedModel& model, CompletionRequest& r, Json* tools) {
  const Json* list = Field(body, "tools");
  std::vector<std::string> names;
  if (list != nullptr) {
    if (!list->is_array()) {
      return ParamError("tools", absl::StrCat("'tools' must be an array of function tools, got ", Describe(*list)));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& t = (*list)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      const Json* type = t.is_object() ? Field(t, "type") : nullptr;
      if (type == nullptr || *type != "function") {
        return ParamError("tools", absl::StrCat(where, " must be {\"type\": \"function\", \"function\": {...}}"));
      }
      const Json* fn = Field(t, "function");
      const Json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
      if (name == nullptr || !name->is_string() || !IsFunctionName(name->get<std::string>())) {
        return ParamError("tools", absl::StrCat(where, ".function.name must be 1-64 letters, digits, '_' or '-'"));
      }
      if (const Json* d = Field(*fn, "description"); d != nullptr && !d->is_string()) {
        return ParamError("tools", absl::StrCat(where, ".function.description must be a string, got ", Describe(*d)));
      }
      if (const Json* p = Field(*fn, "parameters"); p != nullptr && !p->is_object()) {
        return ParamError("tools", absl::StrCat(where, ".function.parameters must be a JSON Schema object, got ",
                                                Describe(*p)));
      }
      names.push_back(name->get<std::string>());
    }
  }
  bool parallel = true;
  RETURN_IF_ERROR(GetBool(body, "parallel_tool_calls", &parallel));
  std::string choice = names.empty() ? "none" : "auto";
  std::string named;  // The function tool_choice names.
  if (const Json* c = Field(body, "tool_choice"); c != nullptr) {
    if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        return ParamError("tool_choice", absl::StrCat("'tool_choice' must be none, auto, required or a named "
                                                      "function, got ", Describe(*c)));
      }
    } else {
      const Json* fn = c->is_object() ? Field(*c, "function") : nullptr;
      const Json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
      if (Field(*c, "type") == nullptr || *Field(*c, "type") != "function" || name == nullptr || !name->is_string()) {
        return ParamError("tool_choice",
                          "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}");
      }
      if (std::find(names.begin(), names.end(), name->get<std::string>()) == names.end()) {
        return ParamError("tool_choice", absl::StrCat("'tool_choice' names the function '", name->get<std::string>(),
                                                      "', which 'tools' does not define"));
      }
      choice = "named";
      named = name->get<std::string>();
    }
  }
  if (choice == "none") return absl::OkStatus();  // Tools neither shown nor parsed.
  if (names.empty()) {
    return ParamError("tool_choice", absl::StrCat("'tool_choice' ", choice, " needs 'tools'"));
  }
  if (!model.format->has_chat_template() || !model.format->reads_tools()) {
    return ParamError("tools", absl::StrCat("the model `", model.name,
                                            "`'s chat template does not render tools, so the model cannot be "
                                            "told about them"));
  }
  r.tool_format = ToolFormatOf(model.format->chat_template_source());
  if (r.tool_format == ToolFormat::kNone) {
    return ParamError("tools", absl::StrCat("the model `", model.name,
                                            "`'s chat template asks for tool calls in a form duet cannot parse "
                                            "(it parses Hermes <tool_call> JSON and Llama-3.1's JSON)"));
  }
  r.max_tool_calls = parallel ? 0 : 1;
  if (choice != "auto") r.tool_prefix = ToolCallOpening(r.tool_format, named);  // required: named is "".
  if (choice == "named") r.max_tool_calls = 1;
  *tools = *list;
  // A forced call, or with auto a strict function, follows the functions'
  // parameters: a grammar over the calls (with auto, started by the
  // call's opening, the text before it free).
  bool any_strict = false;
  grammar::ToolCallsShape shape;
  std::vector<bool> strict;
  for (const Json& t : *list) {
    const Json& fn = t["function"];
    const Json* st = Field(fn, "strict");
    if (st != nullptr && !st->is_boolean()) return ParamError("tools", "a function's 'strict' must be a boolean");
    strict.push_back(st != nullptr && st->get<bool>());
    any_strict = any_strict || strict.back();
    const Json* params = Field(fn, "parameters");
    shape.tools.push_back({fn["name"].get<std::string>(), params != nullptr ? *params : Json::parse(R"({"type":"object"})")});
  }
  if (choice == "auto" && !any_strict) return absl::OkStatus();
  const bool hermes = r.tool_format == ToolFormat::kHermes;
  const std::string opening = ToolCallOpening(r.tool_format, "");
  shape.named = named;
  shape.name_close = hermes ? "\", \"arguments\": " : "\", \"parameters\": ";
  shape.close = hermes ? "}\n</tool_call>" : "}";
  if (r.max_tool_calls != 1) shape.next_open = absl::StrCat(hermes ? "\n" : "; ", opening);
  grammar::ConstraintRequest g{.kind = grammar::ConstraintKind::kToolCalls};
  if (choice == "auto") {
    // Hermes: <tool_call> opens a call; Llama-3.1: the output is calls when it opens one.
    g.triggers = {hermes ? "<tool_call>" : opening};
    shape.open = hermes ? opening.substr(std::string("<tool_call>").size()) : "";
  }
  // A function whose parameters the engine cannot enforce: refused when it
  // is strict, else its arguments need only be an object.
  if (model.grammars != nullptr) {
    absl::StatusOr<grammar::GrammarCache*> cache = model.grammars->Get();
    for (size_t i = 0; cache.ok() && i < shape.tools.size(); ++i) {
      if (strict[i]) continue;
      if (!(*cache)->Get({.kind = grammar::ConstraintKind::kJsonSchema,
                          .text = grammar::CompactJson(shape.tools[i].parameters)}).ok()) {
        shape.tools[i].parameters = Json::parse(R"({"type":"object"})");
      }
    }
  }
  g.text = grammar::ToolCallsText(shape);
  r.grammar = std::move(g);
  r.grammar_param = "tools";
  return absl::OkStatus();
}

// A message's "name", a tool message's "tool_call_id" and an assistant's
// "tool_calls".
absl::Status ParseMessageExtras(const Json& m, const std::string& role, const std::string& where,
                                text::ChatMessage& msg) {
  if (const Json* n = Field(m, "name"); n != nullptr) {
    if (!n->is_string()) return ParamError("messages", absl::StrCat(where, ".name must be a string"));
    msg.name = n->get<std::string>();
  }
  if (role == "tool") {
    const Json* id = Field(m, "tool_call_id");
    if (id == nullptr || !id->is_string()) {
      return ParamError("messages", absl::StrCat(where, ".tool_call_id is required (the id of the call it answers)"));
    }
    msg.tool_call_id = id->get<std::string>();
  }
  // An assistant turn's thinking, under either name the router writes it by.
  for (const char* field : {"reasoning_content", "reasoning"}) {
    const Json* r = Field(m, field);
    if (r == nullptr || r->is_null()) continue;
    if (role != "assistant" || !r->is_string()) {
      return ParamError("messages", absl::StrCat(where, ".", field, " must be a string, on an assistant message"));
    }
    msg.reasoning = r->get<std::string>();
    break;
  }
  const Json* calls = Field(m, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (role != "assistant") return ParamError("messages", absl::StrCat(where, ": only assistant messages carry tool_calls"));
  if (!calls->is_array()) {
    return ParamError("messages", absl::StrCat(where, ".tool_calls must be an array, got ", Describe(*calls)));
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const Json& c = (*calls)[k];
    const std::string at = absl::StrCat(where, ".tool_calls[", k, "]");
    const Json* fn = c.is_object() ? Field(c, "function") : nullptr;
    const Json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
    const Json* args = fn != nullptr && fn->is_object() ? Field(*fn, "arguments") : nullptr;
    const Json* id = c.is_object() ? Field(c, "id") : nullptr;
    if (name == nullptr || !name->is_string() || args == nullptr || !args->is_string() ||
        (id != nullptr && !id->is_string())) {
      return ParamError("messages", absl::StrCat(at, " must be {\"id\": string, \"type\": \"function\", "
                                                     "\"function\": {\"name\": string, \"arguments\": string}}"));
    }
    if (Json::parse(args->get<std::string>(), nullptr, false).is_discarded()) {
      return ParamError("messages", absl::StrCat(at, ".function.arguments must be JSON text, got ", Describe(*args)));
    }
    msg.tool_calls.push_back({id != nullptr ? id->get<std::string>() : "", name->get<std::string>(),
                              args->get<std::string>()});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view text, const ServedModel& model,
                                                         uint64_t default_seed) {
  ASSIGN_OR_RETURN(Json body, ParseBody(text));
  RETURN_IF_ERROR(CheckModel(body, model));
  CompletionRequest r;
  r.kind = ApiKind::kCompletion;
  int64_t logprobs = -1;
  RETURN_IF_ERROR(GetInt(body, "logprobs", 0, kMaxLogprobs, &logprobs));
  RETURN_IF_ERROR(GetBool(body, "echo", &r.echo));
  RETURN_IF_ERROR(ParseCommon(body, model, default_seed, r));
  if (r.echo && logprobs >= 0) {
    return ParamError("echo", "'echo' with 'logprobs' (the prompt's logprobs) is not supported");
  }
  ASSIGN_OR_RETURN(std::vector<CompletionRequest::Prompt> prompts, Prompts(body, model, r.echo));
  if (static_cast<int64_t>(prompts.size()) * r.n > kMaxBatchChoices) {
    return ParamError("n", absl::StrCat(prompts.size(), " prompts x n = ", r.n, " is more than the ",
                                        kMaxBatchChoices, " choices one request may hold"));
  }
  const std::vector<int32_t> ids = prompts[0].ids;
  r.echo_text = std::move(prompts[0].echo_text);
  r.spec.mutable_prompt_ids()->Assign(ids.begin(), ids.end());
  r.more_prompts.assign(std::make_move_iterator(prompts.begin() + 1), std::make_move_iterator(prompts.end()));
  // duet's extension for clients that tokenize their own RAG prompts: where
  // each document (and what follows them) starts, as chat `documents` mark.
  if (const Json* b = Field(body, "cache_boundaries"); b != nullptr && !b->is_null()) {
    if (!r.more_prompts.empty()) {
      return ParamError("cache_boundaries", "'cache_boundaries' marks one prompt; send a batch without it");
    }
    if (!b->is_array()) {
      return ParamError("cache_boundaries",
                        absl::StrCat("'cache_boundaries' must be an array of token positions, got ", Describe(*b)));
    }
    int64_t last = 0;
    for (const Json& e : *b) {
      if (!e.is_number_integer() || e.get<int64_t>() <= last || e.get<int64_t>() > static_cast<int64_t>(ids.size())) {
        return ParamError("cache_boundaries",
                          absl::StrCat("'cache_boundaries' must rise within the prompt's ", ids.size(),
                                       " tokens, got ", Describe(e), " after ", last));
      }
      last = e.get<int64_t>();
      r.spec.add_cache_boundaries(static_cast<int32_t>(last));
    }
  }
  r.spec.mutable_sampling()->set_logprobs(logprobs < 0 ? 0 : static_cast<int32_t>(logprobs));
  r.logprobs = static_cast<int>(logprobs);
  RETURN_IF_ERROR(ParseStructured(body, r));
  RETURN_IF_ERROR(FinishGrammar(model, r));
  return r;
}

absl::StatusOr<CompletionRequest> ParseChatRequest(absl::string_view text, const ServedModel& model,
                                                   uint64_t default_seed) {
  ASSIGN_OR_RETURN(Json body, ParseBody(text));
  RETURN_IF_ERROR(CheckModel(body, model));
  CompletionRequest r;
  r.kind = ApiKind::kChat;
  bool logprobs = false;
  int64_t top_logprobs = -1;
  RETURN_IF_ERROR(GetBool(body, "logprobs", &logprobs));
  RETURN_IF_ERROR(GetInt(body, "top_logprobs", 0, kMaxLogprobs, &top_logprobs));
  if (top_logprobs >= 0 && !logprobs) {
    return ParamError("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  RETURN_IF_ERROR(ParseCommon(body, model, default_seed, r));
  Json tools;  // null: none rendered
  RETURN_IF_ERROR(ParseTools(body, model, r, &tools));
  if (r.grammar) {  // The tools' calls follow their parameters: no room for a second format.
    CompletionRequest other;
    RETURN_IF_ERROR(ParseStructured(body, other));
    if (other.grammar) {
      return ParamError(other.grammar_param, absl::StrCat(other.grammar_param, " with strict tools (or a tool_choice "
                                                          "that forces a call): the calls already follow a grammar; "
                                                          "send one"));
    }
  } else {
    RETURN_IF_ERROR(ParseStructured(body, r));
  }
  const Json* msgs = Field(body, "messages");
  if (msgs == nullptr) return ParamError("messages", "'messages' is required");
  if (!msgs->is_array() || msgs->empty()) {
    return ParamError("messages", absl::StrCat("'messages' must be a non-empty array, got ", Describe(*msgs)));
  }
  std::vector<text::ChatMessage> messages;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return ParamError("messages", absl::StrCat(where, " must be an object, got ", Describe(m)));
    const Json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return ParamError("messages", absl::StrCat(where, ".role must be a string"));
    }
    std::string r_name = role->get<std::string>();
    if (r_name == "developer") r_name = "system";  // OpenAI's newer name for it.
    if (r_name != "system" && r_name != "user" && r_name != "assistant" && r_name != "tool") {
      return ParamError("messages", absl::StrCat(where, ".role must be system, user, assistant or tool, got ",
                                                 Describe(*role)));
    }
    text::ChatMessage msg;
    RETURN_IF_ERROR(ParseMessageExtras(m, r_name, where, msg));
    const Json* content = Field(m, "content");
    std::string text;
    if (content == nullptr) {
      if (msg.tool_calls.empty()) return ParamError("messages", absl::StrCat(where, ".content is required"));
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const Json& part = (*content)[k];
        const Json* type = part.is_object() ? Field(part, "type") : nullptr;
        const Json* t = part.is_object() ? Field(part, "text") : nullptr;
        if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" || t == nullptr ||
            !t->is_string()) {
          return ParamError("messages", absl::StrCat(where, ".content[", k,
                                                     "] must be {\"type\": \"text\", \"text\": string}; only "
                                                     "text parts are supported"));
        }
        text += t->get<std::string>();
      }
    } else {
      return ParamError("messages", absl::StrCat(where, ".content must be a string or an array of text parts, got ",
                                                 Describe(*content)));
    }
    msg.role = std::move(r_name);
    msg.content = std::move(text);
    messages.push_back(std::move(msg));
  }
  // vLLM's documents: [{"text", "id"?, "title"?}, ...], rendered after the
  // system message; the prefix cache's nodes start where each one does.
  std::vector<text::ChatDocument> documents;
  if (const Json* docs = Field(body, "documents"); docs != nullptr && !docs->is_null()) {
    if (!docs->is_array()) {
      return ParamError("documents", absl::StrCat("'documents' must be an array of objects, got ", Describe(*docs)));
    }
    for (size_t i = 0; i < docs->size(); ++i) {
      const Json& d = (*docs)[i];
      const std::string where = absl::StrCat("documents[", i, "]");
      if (!d.is_object()) return ParamError("documents", absl::StrCat(where, " must be an object, got ", Describe(d)));
      text::ChatDocument doc;
      for (auto [key, out, required] : {std::tuple<const char*, std::string*, bool>{"text", &doc.text, true},
                                        {"id", &doc.id, false},
                                        {"title", &doc.title, false}}) {
        const Json* v = Field(d, key);
        if (v == nullptr || v->is_null()) {
          if (required) return ParamError("documents", absl::StrCat(where, ".", key, " is required"));
          continue;
        }
        if (!v->is_string()) {
          return ParamError("documents", absl::StrCat(where, ".", key, " must be a string, got ", Describe(*v)));
        }
        *out = v->get<std::string>();
      }
      documents.push_back(std::move(doc));
    }
  }
  if (!model.format->has_chat_template()) {
    return ParamError("messages", absl::StrCat("the model `", model.name, "` cannot chat (",
                                               model.format->chat_unavailable(), "); use /v1/completions"));
  }
  // vLLM's chat_template_kwargs: more variables for the template (Qwen3's
  // enable_thinking).
  Json variables = nullptr;
  if (const Json* kw = Field(body, "chat_template_kwargs"); kw != nullptr && !kw->is_null()) {
    if (!kw->is_object()) {
      return ParamError("chat_template_kwargs",
                        absl::StrCat("'chat_template_kwargs' must be an object, got ", Describe(*kw)));
    }
    variables = *kw;
  }
  std::vector<size_t> starts;
  auto rendered =
      model.format->RenderChat(messages, /*add_generation_prompt=*/true, documents, &starts, tools, variables);
  if (!rendered.ok()) return ParamError("messages", rendered.status().message());
  *rendered += r.tool_prefix;
  r.reasoning = TemplateThinks(model.format->chat_template_source());
  r.reasoning_open = r.reasoning && PromptOpensThinking(*rendered);
  r.reasoning_field = model.reasoning_field;
  // Piece by piece between the documents' starts (each before a special
  // token, so the pieces tokenize as the whole does), noting where each begins.
  std::vector<int32_t> all;
  std::vector<size_t> cuts = starts;
  cuts.push_back(rendered->size());
  size_t from = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (k > 0) r.spec.add_cache_boundaries(static_cast<int32_t>(all.size()));
    auto piece = model.tokenizer->Encode(std::string_view(*rendered).substr(from, cuts[k] - from));
    if (!piece.ok()) return ParamError("messages", piece.status().message());
    all.insert(all.end(), piece->begin(), piece->end());
    from = cuts[k];
  }
  const std::vector<int32_t>* ids = &all;
  if (ids->empty()) return ParamError("messages", "the conversation renders to an empty prompt");
  RETURN_IF_ERROR(CheckLength(ids->size(), model));
  r.spec.mutable_prompt_ids()->Assign(ids->begin(), ids->end());
  if (Field(body, "max_tokens") == nullptr && Field(body, "max_completion_tokens") == nullptr) {
    r.spec.set_max_tokens(static_cast<int32_t>(model.max_model_len - static_cast<int64_t>(ids->size())));
  }
  r.logprobs = logprobs ? static_cast<int>(std::max<int64_t>(top_logprobs, 0)) : -1;
  // Workers report at least the chosen token's logprob; alternatives as asked.
  r.spec.mutable_sampling()->set_logprobs(logprobs ? static_cast<int32_t>(std::max<int64_t>(top_logprobs, 0)) : 0);
  // A model that thinks first: its grammar starts when the thinking ends,
  // unless the prompt already closed it (or ends in a forced call).
  if (r.grammar && r.reasoning && r.tool_prefix.empty() &&
      !absl::EndsWith(absl::StripTrailingAsciiWhitespace(*rendered), "</think>")) {
    r.grammar->triggers.insert(r.grammar->triggers.begin(), "</think>");
  }
  RETURN_IF_ERROR(FinishGrammar(model, r));
  return r;
}

// ---------------------------------------------------------------- responses

ChoiceBuilder::ChoiceBuilder(const text::Tokenizer* tokenizer, const CompletionRequest& params, int index,
                             const std::string& echo_text)
    : tokenizer_(tokenizer),
      kind_(params.kind),
      index_(index),
      logprobs_(params.logprobs),
      stop_(params.stop),
      echo_text_(params.echo ? echo_text : ""),
      detok_(tokenizer, /*skip_special=*/true),
      text_chars_(CountChars(echo_text_)),
      reasoning_field_(params.reasoning_field) {
  if (params.tool_format != ToolFormat::kNone) {
    tools_.emplace(params.tool_format, params.max_tool_calls);
    tools_->Push(params.tool_prefix);  // The prompt's end, which the output continues: nothing to show.
  }
  // A prompt that ends in a tool call's opening is answered by the call, not by thinking.
  if (params.reasoning && params.tool_prefix.empty()) reasoning_.emplace(params.reasoning_open);
}

std::string ChoiceBuilder::Split(std::string text, bool last) {
  if (reasoning_) {  // Thinking first; only the content after it may call tools.
    ReasoningSplitter::Out r = reasoning_->Push(text);
    if (last) {
      ReasoningSplitter::Out rest = reasoning_->Finish();
      r.reasoning += rest.reasoning;
      r.content += rest.content;
    }
    reasoning_text_ += r.reasoning;
    pending_reasoning_ += r.reasoning;
    text = std::move(r.content);
  }
  if (!tools_) return text;
  ToolCallSplitter::Out o = tools_->Push(text);
  if (last) {
    ToolCallSplitter::Out rest = tools_->Finish();
    o.content += rest.content;
    o.calls.insert(o.calls.end(), std::make_move_iterator(rest.calls.begin()),
                   std::make_move_iterator(rest.calls.end()));
  }
  calls_.insert(calls_.end(), std::make_move_iterator(o.calls.begin()), std::make_move_iterator(o.calls.end()));
  return std::move(o.content);
}

std::string ChoiceBuilder::FinishReason(absl::string_view reason) const {
  return !calls_.empty() && reason == "stop" ? "tool_calls" : std::string(reason);
}

nlohmann::ordered_json ChoiceBuilder::CallJson(const ResponseEnvelope& env, size_t k, bool with_index) const {
  Json j;
  if (with_index) j["index"] = k;
  // Unique in the response, and the same in a stream's delta and a retry's.
  j["id"] = absl::StrFormat("call_%016x",
                            static_cast<uint64_t>(std::hash<std::string>{}(absl::StrCat(env.id, "/", index_, "/", k))));
  j["type"] = "function";
  j["function"] = Json{{"name", calls_[k].name}, {"arguments", calls_[k].arguments}};
  return j;
}

ChoiceBuilder::LpEntry ChoiceBuilder::Entry(int32_t id, float logprob) const {
  LpEntry e{.id = id, .logprob = logprob};
  auto bytes = tokenizer_->TokenBytes(id);
  if (bytes.ok()) e.bytes = std::string(*bytes);
  if (text::IsValidUtf8(e.bytes)) {
    e.text = e.bytes;
  } else {  // Part of a character: its bytes, as OpenAI shows such tokens.
    e.text = "bytes:";
    for (unsigned char c : e.bytes) absl::StrAppendFormat(&e.text, "\\x%02x", c);
  }
  return e;
}

std::string ChoiceBuilder::Release(const std::string& piece) {
  if (stop_.empty()) return piece;
  held_ += piece;
  // The earliest stop string in the held text ends the choice there.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that a stop string starts with.
  size_t keep = 0;
  for (const std::string& s : stop_) keep = std::max(keep, PartialTail(held_, s));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string ChoiceBuilder::AddToken(const proto::Token& token, const ResponseEnvelope& env, bool chunk) {
  if (stopped_ || finished_) return "";
  const int32_t id = token.id();
  auto delta = detok_.Push(id);
  std::string piece = delta.ok() ? std::move(*delta) : "";
  const int64_t offset = text_chars_;
  text_chars_ += CountChars(piece);
  const size_t calls_begin = calls_.size();
  std::string shown = Release(piece);
  shown = Split(std::move(shown), /*last=*/stopped_);
  shown_ += shown;
  ids_.push_back(id);
  const size_t lp_index = lp_tokens_.size();
  if (logprobs_ >= 0) {
    lp_tokens_.push_back(Entry(id, token.logprob()));
    std::vector<LpEntry> top;
    for (const proto::TopLogprob& t : token.top()) {
      if (static_cast<int>(top.size()) >= logprobs_) break;
      top.push_back(Entry(t.id(), t.logprob()));
    }
    lp_top_.push_back(std::move(top));
    lp_offsets_.push_back(offset);
  }
  if (!chunk) return "";
  if (first_chunk_ && !echo_text_.empty()) shown = echo_text_ + shown;
  return ChunkJson(env, shown, {id}, lp_index, lp_tokens_.size(), std::nullopt, calls_begin);
}

std::string ChoiceBuilder::FullText() {
  if (!finished_) {
    finished_ = true;
    if (!stopped_) {
      std::string rest = Release(detok_.Finish());
      if (!stopped_) {
        rest += held_;  // Nothing more can complete a stop string.
        held_.clear();
      }
      shown_ += Split(std::move(rest), /*last=*/true);
    }
  }
  return echo_text_ + shown_;
}

nlohmann::ordered_json ChoiceBuilder::LogprobsJson(size_t begin, size_t end) const {
  if (logprobs_ < 0) return nullptr;
  Json lp;
  if (kind_ == ApiKind::kChat) {
    auto bytes = [](const std::string& s) {
      Json b = Json::array();
      for (unsigned char c : s) b.push_back(static_cast<int>(c));
      return b;
    };
    Json content = Json::array();
    auto entry = [&](const LpEntry& t) {
      return Json{{"token", t.text}, {"logprob", FloatJson(t.logprob)}, {"bytes", bytes(t.bytes)}};
    };
    for (size_t i = begin; i < end; ++i) {
      Json e = entry(lp_tokens_[i]);
      Json top = Json::array();
      for (const LpEntry& t : lp_top_[i]) top.push_back(entry(t));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    lp["content"] = std::move(content);
  } else {
    lp["tokens"] = Json::array();
    lp["token_logprobs"] = Json::array();
    lp["top_logprobs"] = Json::array();
    lp["text_offset"] = Json::array();
    for (size_t i = begin; i < end; ++i) {
      lp["tokens"].push_back(lp_tokens_[i].text);
      lp["token_logprobs"].push_back(FloatJson(lp_tokens_[i].logprob));
      // Keyed by text: two tokens of one text (an added token that spells
      // a vocabulary one) would collide, so a repeat is keyed by its id.
      Json top = Json::object();
      for (const LpEntry& t : lp_top_[i]) {
        top[top.contains(t.text) ? absl::StrCat("token_id:", t.id) : t.text] = FloatJson(t.logprob);
      }
      lp["top_logprobs"].push_back(std::move(top));
      lp["text_offset"].push_back(lp_offsets_[i]);
    }
  }
  return lp;
}

namespace {

Json Envelope(const ResponseEnvelope& env, bool chunk) {
  Json out;
  out["id"] = env.id;
  out["object"] = env.kind == ApiKind::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                             : "text_completion";
  out["created"] = env.created;
  out["model"] = env.model;
  out["system_fingerprint"] = env.system_fingerprint;
  return out;
}

Json Usage(int64_t prompt, int64_t completion, int64_t cached) {
  Json u;
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["prompt_tokens_details"] = Json{{"cached_tokens", cached}};
  return u;
}

}  // namespace

namespace {

// A JSON string literal of valid UTF-8 `s`, byte for byte as nlohmann's dump
// writes it (escapes for '"', '\\' and control characters only).
void AppendJsonString(std::string& out, absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

}  // namespace

std::string ChoiceBuilder::ChunkJson(const ResponseEnvelope& env, const std::string& text,
                                     const std::vector<int32_t>& ids, size_t lp_begin, size_t lp_end,
                                     std::optional<absl::string_view> finish_reason, size_t calls_begin) {
  const bool new_calls = calls_begin < calls_.size();
  // The common chunk (a token's text, no logprobs, not the first of a chat
  // choice) written directly: streaming renders one per token per client.
  // The same bytes as the general path below.
  if (lp_end == lp_begin && !finish_reason && !new_calls && pending_reasoning_.empty() &&
      !(kind_ == ApiKind::kChat && first_chunk_) &&
      text::IsValidUtf8(text) && text::IsValidUtf8(env.id) && text::IsValidUtf8(env.model) &&
      text::IsValidUtf8(env.system_fingerprint)) {
    std::string out;
    out.reserve(200 + text.size() + env.model.size());
    out += "{\"id\":";
    AppendJsonString(out, env.id);
    out += kind_ == ApiKind::kChat ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                                   : ",\"object\":\"text_completion\",\"created\":";
    absl::StrAppend(&out, env.created, ",\"model\":");
    AppendJsonString(out, env.model);
    out += ",\"system_fingerprint\":";
    AppendJsonString(out, env.system_fingerprint);
    absl::StrAppend(&out, ",\"choices\":[{\"index\":", index_);
    if (kind_ == ApiKind::kChat) {
      out += ",\"delta\":{";
      if (!text.empty()) {
        out += "\"content\":";
        AppendJsonString(out, text);
      }
      out += "},\"logprobs\":null,\"finish_reason\":null}]}";
    } else {
      out += ",\"text\":";
      AppendJsonString(out, text);
      out += ",\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[";
      for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&out, i ? "," : "", ids[i]);
      out += "]}]}";
    }
    first_chunk_ = false;
    return out;
  }
  Json choice;
  choice["index"] = index_;
  if (kind_ == ApiKind::kChat) {
    Json delta = Json::object();
    if (first_chunk_) delta["role"] = "assistant";
    if (!pending_reasoning_.empty()) {
      delta[reasoning_field_] = std::move(pending_reasoning_);
      pending_reasoning_.clear();
    }
    if (!text.empty()) {
      delta["content"] = text;
    } else if (first_chunk_) {
      delta["content"] = new_calls ? Json(nullptr) : Json("");
    }
    if (new_calls) {
      Json calls = Json::array();
      for (size_t k = calls_begin; k < calls_.size(); ++k) calls.push_back(CallJson(env, k, /*with_index=*/true));
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  first_chunk_ = false;
  choice["logprobs"] = lp_end > lp_begin ? LogprobsJson(lp_begin, lp_end) : Json(nullptr);
  choice["finish_reason"] = finish_reason ? Json(std::string(*finish_reason)) : Json(nullptr);
  if (kind_ == ApiKind::kCompletion) choice["token_ids"] = ids;
  Json out = Envelope(env, /*chunk=*/true);
  out["choices"] = Json::array({std::move(choice)});
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ChoiceBuilder::FinalChunk(const ResponseEnvelope& env, absl::string_view finish_reason) {
  std::string before = shown_;
  const bool first = first_chunk_;
  const size_t calls_begin = calls_.size();
  std::string all = FullText();  // Flushes held text (none after a stop).
  std::string rest = shown_.substr(before.size());
  if (first && !echo_text_.empty()) rest = echo_text_ + rest;
  (void)all;
  return ChunkJson(env, rest, {}, 0, 0, FinishReason(finish_reason), calls_begin);
}

std::string RenderUsageChunk(const ResponseEnvelope& env, int64_t prompt_tokens, int64_t completion_tokens,
                             int64_t cached_tokens) {
  Json out = Envelope(env, /*chunk=*/true);
  out["choices"] = Json::array();
  out["usage"] = Usage(prompt_tokens, completion_tokens, cached_tokens);
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string RenderResponse(const ResponseEnvelope& env, const std::vector<ChoiceBuilder*>& choices,
                           const std::vector<std::string>& finish_reasons, int64_t prompt_tokens,
                           int64_t cached_tokens) {
  Json out = Envelope(env, /*chunk=*/false);
  Json list = Json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    ChoiceBuilder& c = *choices[i];
    Json choice;
    choice["index"] = c.index();
    const std::string text = c.FullText();
    if (env.kind == ApiKind::kChat) {
      Json message{{"role", "assistant"}, {"content", text}};
      if (c.reasoning_) {
        message[c.reasoning_field_] = c.reasoning_text_.empty() ? Json(nullptr) : Json(c.reasoning_text_);
      }
      if (!c.calls_.empty()) {
        if (absl::StripAsciiWhitespace(text).empty()) message["content"] = nullptr;
        Json calls = Json::array();
        for (size_t k = 0; k < c.calls_.size(); ++k) calls.push_back(c.CallJson(env, k, /*with_index=*/false));
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = c.LogprobsJson(0, c.lp_tokens_.size());
    choice["finish_reason"] = c.FinishReason(finish_reasons[i]);
    if (env.kind == ApiKind::kCompletion) choice["token_ids"] = c.token_ids();
    list.push_back(std::move(choice));
    completion += c.completion_tokens();
  }
  out["choices"] = std::move(list);
  out["usage"] = Usage(prompt_tokens, completion, cached_tokens);
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace duet::router

#include "router/router_impl.h"
#include "proto/frame.h"

namespace duet::router {

// ---------------------------------------------------------------- HTTP

void Router::Impl::Handle(http::HttpRequest req, http::HttpExchangePtr ex) {
  const std::string& path = req.path;
  auto method_is = [&](const char* m, const char* also = nullptr) {
    if (req.method == m || (also != nullptr && req.method == also)) return true;
    ex->Reply(JsonResponse(405, ErrorJson(absl::InvalidArgumentError(
                                    absl::StrCat("method ", req.method, " is not allowed on ", path)))));
    return false;
  };
  constexpr absl::string_view kModel = "/v1/models/";
  if (path == "/v1/completions") {
    if (method_is("POST") && Authorized(req, ex)) HandleCompletion(std::move(req), std::move(ex), ApiKind::kCompletion);
  } else if (path == "/v1/chat/completions") {
    if (method_is("POST") && Authorized(req, ex)) HandleCompletion(std::move(req), std::move(ex), ApiKind::kChat);
  } else if (path == "/v1/models") {
    if (method_is("GET") && Authorized(req, ex)) HandleModels(std::move(ex));
  } else if (absl::StartsWith(path, kModel)) {
    // The SDK's models.retrieve: the id percent-encoded ("org%2Fname").
    if (method_is("GET") && Authorized(req, ex)) HandleModel(http::PercentDecode(path.substr(kModel.size())), std::move(ex));
  } else if (path == "/reset_prefix_cache") {
    if (method_is("POST") && Authorized(req, ex)) HandleResetPrefixCache(std::move(ex));
  } else if (path == "/workers/role") {
    if (method_is("POST") && Authorized(req, ex)) HandleSwitchRole(req, std::move(ex));
  } else if (path == "/health") {
    if (method_is("GET", "HEAD")) HandleHealth(std::move(ex));  // HEAD: the status, no body
  } else if (path == "/stats") {
    if (method_is("GET")) HandleStats(std::move(ex));
  } else if (path == "/figures") {
    if (method_is("GET")) HandleFigures(req, std::move(ex));
  } else if (path == "/metrics") {
    if (method_is("GET")) {
      http::HttpResponse r;
      r.content_type = "text/plain; version=0.0.4";
      r.body = MetricsRegistry::Default().RenderText();
      ex->Reply(std::move(r));
    }
  } else {
    ex->Reply(JsonResponse(404, ErrorJson(WithCode(absl::NotFoundError(absl::StrCat("no route for ", path)),
                                                   "unknown_url"))));
  }
}

// vLLM's endpoint of the same name: every prefill and colocated worker empties its tree
// (entries that running or leased requests pin stay until they end).
void Router::Impl::HandleResetPrefixCache(http::HttpExchangePtr ex) {
  int sent = 0;
  {
    absl::MutexLock lock(&mu_);
    proto::Frame f = proto::NewFrame();
    f.mutable_reset_prefix_cache();
    for (const WorkerSnapshot& w : registry_->Snapshot()) {
      if ((w.role == proto::ROLE_PREFILL || w.role == proto::ROLE_COLOCATED) && registry_->Send(w.id, f)) ++sent;
    }
  }
  ex->Reply(JsonResponse(200, nlohmann::json{{"reset_workers", sent}}.dump()));
}

// POST /workers/role {"worker": ID, "role": "prefill" | "decode"}: a flex
// worker drains the role it serves and registers again in the other
// (SwitchRole). 202 once told; 400 for a bad body; 404 for no such live
// worker; 409 for one not started with --role flex, draining, or in that
// role already.
void Router::Impl::HandleSwitchRole(const http::HttpRequest& req, http::HttpExchangePtr ex) {
  auto fail = [&](int code, absl::Status s) { ex->Reply(JsonResponse(code, ErrorJson(s))); };
  const Json j = Json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("worker") || !j["worker"].is_string() || !j.contains("role") ||
      !j["role"].is_string() || (j["role"] != "prefill" && j["role"] != "decode")) {
    return fail(400, absl::InvalidArgumentError(
                         "the body must be {\"worker\": ID, \"role\": \"prefill\" or \"decode\"}"));
  }
  const std::string id = j["worker"];
  const proto::Role to = j["role"] == "prefill" ? proto::ROLE_PREFILL : proto::ROLE_DECODE;
  absl::MutexLock lock(&mu_);
  for (const WorkerSnapshot& w : registry_->Snapshot()) {
    if (w.id != id) continue;
    if (!w.flex) return fail(409, absl::FailedPreconditionError(absl::StrCat("worker ", id, " was not started with --role flex")));
    if (w.draining) return fail(409, absl::FailedPreconditionError(absl::StrCat("worker ", id, " is draining")));
    if (w.role == to) {
      return fail(409, absl::FailedPreconditionError(absl::StrCat("worker ", id, " serves ", RoleName(to), " already")));
    }
    proto::Frame f = proto::NewFrame();
    f.mutable_switch_role()->set_role(to);
    if (!registry_->Send(id, f)) break;
    LOG(INFO) << "worker " << id << ": switching from " << RoleName(w.role) << " to " << RoleName(to);
    return ex->Reply(JsonResponse(
        202, Json{{"worker", id}, {"from", std::string(RoleName(w.role))}, {"role", std::string(RoleName(to))}}.dump()));
  }
  fail(404, absl::NotFoundError(absl::StrCat("no live worker ", id)));
}

bool Router::Impl::Authorized(const http::HttpRequest& req, const http::HttpExchangePtr& ex) {
  if (options_.api_key.empty()) return true;
  auto it = req.headers.find("authorization");
  absl::Status s;
  if (it == req.headers.end()) {
    s = absl::UnauthenticatedError(
        "You didn't provide an API key. Send it in the Authorization header: Bearer YOUR_KEY");
  } else {
    absl::string_view v = it->second;
    // Constant time over the key's length: no early exit on the first mismatch.
    bool ok = absl::ConsumePrefix(&v, "Bearer ") && v.size() == options_.api_key.size();
    unsigned diff = ok ? 0 : 1;
    for (size_t i = 0; ok && i < v.size(); ++i) diff |= static_cast<unsigned char>(v[i] ^ options_.api_key[i]);
    if (diff == 0) return true;
    s = absl::UnauthenticatedError("Incorrect API key provided");
  }
  ++rejected_auth_;
  total_rejected_->Increment();
  http::HttpResponse r = JsonResponse(401, ErrorJson(WithCode(s, "invalid_api_key")));
  r.headers.push_back({"WWW-Authenticate", "Bearer"});
  ex->Reply(std::move(r));
  return false;
}

Json Router::Impl::ModelJson() const {
  Json model;
  model["id"] = options_.served_model_name;
  model["object"] = "model";
  model["created"] = created_;
  model["owned_by"] = "duet";
  model["max_model_len"] = served_.max_model_len;
  return model;
}

void Router::Impl::HandleModels(http::HttpExchangePtr ex) {
  Json out;
  out["object"] = "list";
  out["data"] = Json::array({ModelJson()});
  ex->Reply(JsonResponse(200, out.dump()));
}

void Router::Impl::HandleModel(const std::string& id, http::HttpExchangePtr ex) {
  if (id != options_.served_model_name) {
    absl::Status s = WithCode(absl::NotFoundError(absl::StrCat("The model `", id, "` does not exist")),
                              "model_not_found");
    ex->Reply(JsonResponse(404, ErrorJson(s)));
    return;
  }
  ex->Reply(JsonResponse(200, ModelJson().dump()));
}

void Router::Impl::HandleHealth(http::HttpExchangePtr ex) {
  absl::Status s = dispatch::CanServe(registry_->LiveLoads());
  Json out;
  out["status"] = s.ok() ? "ok" : "unavailable";
  if (!s.ok()) out["error"] = std::string(s.message());
  ex->Reply(JsonResponse(s.ok() ? 200 : 503, out.dump()));
}

void Router::Impl::HandleCompletion(http::HttpRequest req, http::HttpExchangePtr ex, ApiKind kind) {
  const absl::Time arrival = options_.clock->Now();
  const absl::Time handler_start = absl::Now();
  auto parsed = kind == ApiKind::kChat ? ParseChatRequest(req.body, served_, RandomU64())
                                       : ParseCompletionRequest(req.body, served_, RandomU64());
  if (!parsed.ok()) {
    total_rejected_->Increment();
    {
      absl::MutexLock lock(&mu_);
      ++n_rejected_;
    }
    ex->Reply(JsonResponse(HttpStatusFor(parsed.status()), ErrorJson(parsed.status())));
    return;
  }
  auto g = std::make_shared<Group>();
  g->params = std::move(*parsed);
  g->arrival = arrival;
  g->out = std::make_shared<Outbox>(ex);
  g->env = ResponseEnvelope{
      .kind = kind,
      .id = absl::StrFormat("%s-%016x%016x", kind == ApiKind::kChat ? "chatcmpl" : "cmpl", RandomU64(), RandomU64()),
      .created = absl::ToUnixSeconds(absl::Now()),
      .model = options_.served_model_name,
      .system_fingerprint = system_fingerprint_};
  // Prompt i's choice j is choice i x n + j.
  for (int i = 0; i < g->params.prompts(); ++i) {
    const std::string& echo = i == 0 ? g->params.echo_text : g->params.more_prompts[i - 1].echo_text;
    for (int j = 0; j < g->params.n; ++j) {
      auto r = std::make_shared<Request>();
      const int index = i * g->params.n + j;
      r->group = g;
      r->index = index;
      r->spec = g->params.spec;
      if (i > 0) {
        const std::vector<int32_t>& ids = g->params.more_prompts[i - 1].ids;
        r->spec.mutable_prompt_ids()->Assign(ids.begin(), ids.end());
      }
      r->spec.set_choice_index(static_cast<uint32_t>(index));
      r->builder = std::make_unique<ChoiceBuilder>(tokenizer_.get(), g->params, index, echo);
      g->prompt_tokens += j == 0 ? r->spec.prompt_ids_size() : 0;
      g->choices.push_back(std::move(r));
    }
  }
  g->cached_tokens.assign(g->params.prompts(), 0);
  g->finish.assign(g->choices.size(), "");
  g->remaining = static_cast<int>(g->choices.size());
  uint64_t seq = 0;
  Pending p;
  {
    absl::MutexLock lock(&mu_);
    g->seq = next_seq_++;
    p.Add(g->out);
    absl::Status s;
    if (static_cast<int64_t>(requests_.size()) >= options_.max_requests) {
      s = WithCode(absl::ResourceExhaustedError(absl::StrCat(
                       "the server has ", requests_.size(), " requests in flight, its limit (--max-requests); "
                       "retry later")),
                   "queue_full");
    }
    if (s.ok()) s = tracker_->Start(g->choices, static_cast<size_t>(g->params.n));
    if (!s.ok()) {
      for (const RequestTracker::ChoicePtr& c : g->choices) tracker_->Drop(c);
      ++n_rejected_;
      total_rejected_->Increment();
      http::HttpResponse resp = JsonResponse(HttpStatusFor(s), ErrorJson(s));
      if (resp.status == 429 || resp.status == 503) resp.headers.push_back({"Retry-After", "1"});
      g->out->Reply(std::move(resp));
    } else {
      seq = g->seq;
      requests_[seq] = g;
      for (const RequestTracker::ChoicePtr& c : g->choices) load_->Arrived(g->arrival, c->spec.prompt_ids_size());
      if (g->params.stream) g->out->StartStream();
      g->inbound = absl::Now() - handler_start;  // Parsed, tokenized, dispatched.
    }
  }
  p.Flush();
  if (seq != 0) ex->OnClientGone([this, seq] { OnClientGone(seq); });
}

void Router::Impl::OnClientGone(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(seq);
  if (it == requests_.end()) return;
  GroupPtr g = it->second;
  LOG(INFO) << "client of request " << g->env.id << " disconnected; cancelling it";
  DropGroup(g);
  ++n_cancelled_;
  total_cancelled_->Increment();
}

void Router::Impl::DropGroup(const GroupPtr& g) {
  g->ended = true;
  for (const RequestTracker::ChoicePtr& c : g->choices) tracker_->Drop(c);
  requests_.erase(g->seq);
}

}  // namespace duet::router

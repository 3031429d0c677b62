#include "router/router_impl.h"
#include "proto/frame.h"

namespace duet::router {

// ---------------------------------------------------------------- state machine

Router::Impl::RequestPtr Router::Impl::FindAttempt(uint64_t id) {
  auto it = attempts_.find(id);
  return it == attempts_.end() ? nullptr : it->second;
}

absl::Status Router::Impl::StartAttempt(const RequestPtr& r, Pending& p) {
  if (r->attempts - r->migrations >= options_.max_attempts) {
    return absl::UnavailableError(absl::StrCat("the request failed after ", r->attempts,
                                               " attempts; the last failure: ", r->last_failure));
  }
  const std::vector<int32_t>& resume = r->builder->token_ids();
  std::vector<int32_t> tokens(r->spec.prompt_ids().begin(), r->spec.prompt_ids().end());
  tokens.insert(tokens.end(), resume.begin(), resume.end());
  // The registry may lose the picked worker between LiveLoads and Send; pick again.
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatch::Pick(*dispatcher_, registry_->LiveLoads(), {.prompt = tokens});
    if (!a.ok()) return a.status();
    const uint64_t id = next_attempt_id_++;
    proto::Frame f = proto::NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    pr->set_request_id(id);
    *pr->mutable_spec() = r->spec;
    pr->mutable_resume_ids()->Assign(resume.begin(), resume.end());
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!registry_->Send(a->prefill_id, f)) continue;
    r->charged = registry_->Charge(*a, static_cast<int64_t>(tokens.size()), id);
    r->attempts++;
    r->attempt_id = id;
    r->prefill_id = a->prefill_id;
    r->decode_id = a->decode_id;
    r->first_token = false;
    r->decode_heard = false;
    r->held.clear();
    attempts_[id] = r;
    return absl::OkStatus();
  }
  return absl::UnavailableError("no live worker accepted the request");
}

absl::Status Router::Impl::StartGroup(const GroupPtr& g) {
  const size_t n = static_cast<size_t>(g->params.n);
  for (size_t first = 0; first < g->choices.size(); first += n) {
    RETURN_IF_ERROR(StartPrompt(g, first, n));
  }
  return absl::OkStatus();
}

absl::Status Router::Impl::StartPrompt(const GroupPtr& g, size_t first, size_t n) {
  const proto::GenerationSpec& spec = g->choices[first]->spec;
  const std::vector<int32_t> tokens(spec.prompt_ids().begin(), spec.prompt_ids().end());
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatch::Pick(*dispatcher_, registry_->LiveLoads(), {.prompt = tokens});
    if (!a.ok()) return a.status();
    proto::Frame f = proto::NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < n; ++i) ids.push_back(next_attempt_id_++);
    pr->set_request_id(ids[0]);
    *pr->mutable_spec() = spec;
    for (size_t i = 1; i < ids.size(); ++i) pr->add_sibling_request_ids(ids[i]);
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!registry_->Send(a->prefill_id, f)) continue;
    const WorkerRegistry::Charged charged = registry_->Charge(*a, static_cast<int64_t>(tokens.size()), ids[0]);
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestPtr& r = g->choices[first + i];
      r->charged = i == 0 ? charged : WorkerRegistry::Charged{};  // The prompt is computed once.
      r->attempts = 1;
      r->attempt_id = ids[i];
      r->prefill_id = a->prefill_id;
      r->decode_id = a->decode_id;
      r->first_token = false;
      r->decode_heard = false;
      r->held.clear();
      attempts_[ids[i]] = r;
    }
    return absl::OkStatus();
  }
  return absl::UnavailableError("no live worker accepted the request");
}

void Router::Impl::Redispatch(const RequestPtr& r, const std::string& reason, Pending& p) {
  Forget(r);
  r->last_failure = reason;
  // The client has every token it asked for, or the last of them ended the
  // request (the attempt that sampled it died before its Finish): the one
  // finish rule, as a worker given the resumed tokens would judge them.
  switch (spec::ResumedEnd(spec::ToGenerationParams(r->spec), config_, r->spec.prompt_ids_size(),
                           r->builder->token_ids())) {
    case spec::FinishDecision::kStop:
      Complete(r, proto::FINISH_STOP, p);
      return;
    case spec::FinishDecision::kLength:
      Complete(r, proto::FINISH_LENGTH, p);
      return;
    case spec::FinishDecision::kContinue:
      break;
  }
  absl::Status s = StartAttempt(r, p);
  if (!s.ok()) {
    Fail(r, absl::UnavailableError(absl::StrCat(reason, "; cannot retry: ", s.message())), p);
    return;
  }
  ++n_redispatched_;
  LOG(INFO) << "re-dispatched a request (" << reason << ") as attempt " << r->attempt_id << " on "
            << r->prefill_id << " -> " << r->decode_id << " with " << r->builder->token_ids().size()
            << " resumed tokens";
}

void Router::Impl::Deliver(const RequestPtr& r, const proto::Token& token, Pending& p) {
  if (r->done) return;
  if (static_cast<int64_t>(r->builder->token_ids().size()) >= r->spec.max_tokens()) {
    LOG(WARNING) << "attempt " << r->attempt_id << " sent a token past max_tokens; dropped";
    return;
  }
  GroupPtr gp = r->group.lock();
  if (gp == nullptr) return;
  Group& g = *gp;
  const absl::Time now = options_.clock->Now();
  if (!g.any_token) {
    g.any_token = true;
    ttft_->Observe(absl::ToDoubleSeconds(now - g.arrival));
    frame_firsts_.push_back(g.inbound);
  } else {
    ++frame_tokens_;
  }
  if (!r->any_token) {
    r->any_token = true;
    r->first_token_at = now;
  } else {
    itl_->Observe(absl::ToDoubleSeconds(now - r->last_token_at));
  }
  r->last_token_at = now;
  std::string chunk = r->builder->AddToken(token, g.env, g.params.stream);
  if (g.params.stream && !chunk.empty()) {
    g.out->Event(std::move(chunk));
    p.Add(g.out);
  }
  if (r->builder->stopped()) {
    // A stop string: the choice is complete; the workers stop generating it.
    SendCancel(r, "");
    Complete(r, proto::FINISH_STOP, p);
  }
}

void Router::Impl::SendCancel(const RequestPtr& r, const std::string& except) {
  proto::Frame f = proto::NewFrame();
  f.mutable_cancel()->set_request_id(r->attempt_id);
  if (r->prefill_id != except) registry_->Send(r->prefill_id, f);
  if (r->decode_id != except && r->decode_id != r->prefill_id) registry_->Send(r->decode_id, f);
}

void Router::Impl::Forget(const RequestPtr& r) {
  attempts_.erase(r->attempt_id);
  registry_->Uncharge(r->charged);  // Its prefill will not compute it (or has).
  r->charged = {};
}

void Router::Impl::Complete(const RequestPtr& r, proto::FinishReason reason, Pending& p) {
  Forget(r);
  if (r->done) return;
  r->done = true;
  GroupPtr g = r->group.lock();
  if (g == nullptr) return;
  if (g->ended) return;
  const std::string why = FinishReasonName(reason);
  g->finish[r->index] = why;
  const size_t n = r->builder->token_ids().size();
  if (n > 1) tpot_->Observe(absl::ToDoubleSeconds(r->last_token_at - r->first_token_at) / (n - 1));
  if (g->params.stream) g->out->Event(r->builder->FinalChunk(g->env, why));
  p.Add(g->out);
  if (--g->remaining > 0) return;
  // Every choice is done: the response ends.
  g->ended = true;
  requests_.erase(g->seq);
  ++n_ok_;
  total_ok_->Increment();
  e2e_->Observe(absl::ToDoubleSeconds(options_.clock->Now() - g->arrival));
  const int64_t prompt = g->prompt_tokens;
  int64_t cached = 0;
  for (int64_t c : g->cached_tokens) cached += c;
  if (g->params.stream) {
    if (g->params.include_usage) {
      int64_t completion = 0;
      for (const RequestPtr& c : g->choices) completion += c->builder->completion_tokens();
      g->out->Event(RenderUsageChunk(g->env, prompt, completion, cached));
    }
    g->out->Event("[DONE]");
    g->out->EndStream();
  } else {
    std::vector<ChoiceBuilder*> builders;
    for (const RequestPtr& c : g->choices) builders.push_back(c->builder.get());
    g->out->Reply(JsonResponse(200, RenderResponse(g->env, builders, g->finish, prompt, cached)));
  }
}

void Router::Impl::Fail(const RequestPtr& r, const absl::Status& status, Pending& p) {
  Forget(r);
  r->done = true;
  if (GroupPtr g = r->group.lock()) FailGroup(g, status, p);
}

void Router::Impl::FailGroup(const GroupPtr& g, const absl::Status& status, Pending& p) {
  if (g->ended) return;
  DropGroup(g);  // The other choices stop too: the response is an error.
  ++n_error_;
  total_error_->Increment();
  LOG(WARNING) << "request " << g->env.id << " failed: " << status;
  if (g->params.stream) {
    g->out->Event(ErrorJson(status));
    g->out->Event("[DONE]");
    g->out->EndStream();
  } else {
    http::HttpResponse resp = JsonResponse(HttpStatusFor(status), ErrorJson(status));
    if (resp.status == 503) resp.headers.push_back({"Retry-After", "1"});
    g->out->Reply(std::move(resp));
  }
  p.Add(g->out);
}

void Router::Impl::ApplyFinish(const RequestPtr& r, const proto::Finish& fin, const std::string& from,
                               Pending& p) {
  switch (fin.reason()) {
    case proto::FINISH_STOP:
    case proto::FINISH_LENGTH:
      Complete(r, fin.reason(), p);
      return;
    case proto::FINISH_ERROR:
      if (fin.error_code() == static_cast<int>(absl::StatusCode::kUnavailable)) {
        // The KV pull failed (prefill gone, lease expired): prefill again
        // with everything the client already has; it continues seamlessly.
        SendCancel(r, from);
        Redispatch(r, absl::StrCat("worker ", from, ": ", fin.error()), p);
        return;
      }
      break;
    default:
      break;
  }
  SendCancel(r, from);
  absl::StatusCode code = fin.reason() == proto::FINISH_ERROR && fin.error_code() > 0 &&
                                  fin.error_code() <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                              ? static_cast<absl::StatusCode>(fin.error_code())
                              : absl::StatusCode::kInternal;
  std::string what = fin.reason() == proto::FINISH_CANCELLED ? "cancelled the request" : "failed the request";
  Fail(r, absl::Status(code, absl::StrCat("worker ", from, " ", what, fin.error().empty() ? "" : ": ", fin.error())),
       p);
}

void Router::Impl::OnFirstToken(const std::string& from, const proto::FirstToken& ft, Pending& p) {
  RequestPtr r = FindAttempt(ft.request_id());
  if (!r || from != r->prefill_id || r->first_token) return;  // Stale or duplicate.
  r->first_token = true;
  registry_->Uncharge(r->charged);
  r->charged = {};
  if (GroupPtr g = r->group.lock()) {
    int64_t& cached = g->cached_tokens[r->index / g->params.n];
    cached = std::max(cached, ft.cached_tokens());
  }
  Deliver(r, ft.token(), p);
  std::vector<std::variant<proto::Token, proto::Finish>> held;
  held.swap(r->held);
  const uint64_t attempt = r->attempt_id;
  for (auto& e : held) {
    if (FindAttempt(attempt) != r) break;  // The request ended or moved on.
    if (auto* t = std::get_if<proto::Token>(&e)) {
      Deliver(r, *t, p);
    } else {
      ApplyFinish(r, std::get<proto::Finish>(e), r->decode_id, p);
    }
  }
}

void Router::Impl::OnToken(const std::string& from, const proto::TokenEvent& ev, Pending& p) {
  RequestPtr r = FindAttempt(ev.request_id());
  if (!r || from != r->decode_id) return;
  r->decode_heard = true;
  if (!r->first_token) {
    r->held.emplace_back(ev.token());
    return;
  }
  Deliver(r, ev.token(), p);
}

void Router::Impl::OnFinish(const std::string& from, const proto::Finish& fin, Pending& p) {
  RequestPtr r = FindAttempt(fin.request_id());
  if (!r || (from != r->prefill_id && from != r->decode_id)) return;
  if (from == r->decode_id) r->decode_heard = true;
  if (!r->first_token && from != r->prefill_id) {
    r->held.emplace_back(fin);
    return;
  }
  ApplyFinish(r, fin, from, p);
}

void Router::Impl::OnWorkerFrame(const std::string& worker_id, proto::Frame frame) {
  // The router's own time per token: from this frame's handler to its events
  // handed to the clients' connections (the socket writes follow on the same
  // io thread).
  const absl::Time frame_start = absl::Now();
  Pending p;
  std::vector<absl::Duration> firsts;
  int64_t tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    frame_firsts_.clear();
    frame_tokens_ = 0;
    HandleFrame(worker_id, frame, p);
    firsts.swap(frame_firsts_);
    tokens = frame_tokens_;
  }
  p.Flush();
  if (firsts.empty() && tokens == 0) return;
  const absl::Duration took = absl::Now() - frame_start;
  for (absl::Duration in : firsts) overhead_request_->Observe(absl::ToDoubleSeconds(in + took));
  for (int64_t i = 0; i < tokens; ++i) overhead_token_->Observe(absl::ToDoubleSeconds(took));
  frame_seconds_->Increment(absl::ToDoubleSeconds(took));
  frame_tokens_total_->Increment(static_cast<double>(tokens + static_cast<int64_t>(firsts.size())));
}

void Router::Impl::HandleFrame(const std::string& worker_id, proto::Frame& frame, Pending& p) {
  switch (frame.msg_case()) {
    case proto::Frame::kFirstToken:
      OnFirstToken(worker_id, frame.first_token(), p);
      break;
    case proto::Frame::kTokens:
      for (const proto::TokenEvent& ev : frame.tokens().events()) OnToken(worker_id, ev, p);
      break;
    case proto::Frame::kFinish:
      OnFinish(worker_id, frame.finish(), p);
      break;
    case proto::Frame::kCacheEvents:
      if (!cache_index_.Apply(worker_id, frame.cache_events())) {
        // Not current (a gap, or deltas before any snapshot): ask for the whole set.
        proto::Frame ask = proto::NewFrame();
        ask.mutable_cache_snapshot_request();
        registry_->Send(worker_id, ask);
      }
      break;
    case proto::Frame::kStats:
      for (auto it = stats_queries_.begin(); it != stats_queries_.end();) {
        StatsQueryPtr q = *it++;  // FinishStats unlinks q.
        if (q->waiting.erase(worker_id) > 0) {
          q->fresh.insert(worker_id);
          if (q->waiting.empty()) FinishStats(q, p);
        }
      }
      break;
    default:
      LOG(WARNING) << "unexpected frame (field " << frame.msg_case() << ") from worker " << worker_id;
  }
}

void Router::Impl::OnWorkerLive(const std::string& worker_id, proto::Role role, bool restarted) {
  if (restarted) {
    LOG(INFO) << "worker " << worker_id << " is back after a restart";
    absl::MutexLock lock(&mu_);
    ++n_restarts_[std::string(RoleName(role))];
    if (Counter* c = restarts_total_[std::string(RoleName(role))]) c->Increment();
  }
  if (role != proto::ROLE_PREFILL && role != proto::ROLE_COLOCATED) return;
  // Its prefix cache's whole set, to start the index from.
  proto::Frame ask = proto::NewFrame();
  ask.mutable_cache_snapshot_request();
  registry_->Send(worker_id, ask);
}

void Router::Impl::OnWorkerLost(const std::string& worker_id, proto::Role role, const std::string& reason) {
  Pending p;
  absl::MutexLock lock(&mu_);
  cache_index_.Drop(worker_id);
  std::vector<RequestPtr> affected;
  for (const auto& [id, r] : attempts_) {
    if (r->prefill_id == worker_id || r->decode_id == worker_id) affected.push_back(r);
  }
  for (const RequestPtr& r : affected) {
    if (r->done || FindAttempt(r->attempt_id) != r) continue;  // Ended with an earlier one's group.
    if (r->prefill_id == worker_id &&
        (!r->first_token || (r->decode_id != worker_id && !r->decode_heard))) {
      // Either nothing reached the client, or token 1 did but the decode has
      // not shown that it pulled the KV (the offer may have died with the
      // prefill): run it elsewhere, resuming after the tokens already sent.
      // The old attempt is cancelled on the decode, so if it did pull, its
      // tokens are dropped as stale and the client sees each token once.
      SendCancel(r, worker_id);
      Redispatch(r, absl::StrCat("prefill worker ", worker_id, " was lost (", reason, ")"), p);
    } else if (r->decode_id == worker_id) {
      SendCancel(r, worker_id);
      const std::string lost = absl::StrCat("decode worker ", worker_id, " was lost (", reason, ")");
      if (r->migrations >= options_.max_migrations) {
        Fail(r, absl::UnavailableError(absl::StrCat(lost, "; the request has moved ", r->migrations,
                                                    " times, its limit (--max-migrations)")),
             p);
        continue;
      }
      // Migrate: prefill the prompt and the tokens the client has again,
      // then decode elsewhere; the client's stream goes on.
      ++r->migrations;
      ++n_migrated_;
      total_migrated_->Increment();
      Redispatch(r, lost, p);
    }
  }
  for (auto it = stats_queries_.begin(); it != stats_queries_.end();) {
    StatsQueryPtr q = *it++;
    if (q->waiting.erase(worker_id) > 0 && q->waiting.empty()) FinishStats(q, p);
  }
}

}  // namespace duet::router

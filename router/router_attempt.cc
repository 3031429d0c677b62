#include "router/router_impl.h"
#include "proto/frame.h"

namespace duet::router {

// ---------------------------------------------------------------- the client side of each choice

bool Router::Impl::Deliver(RequestTracker::Choice& c, const proto::Token& token, Pending& p) {
  Request& r = static_cast<Request&>(c);
  GroupPtr gp = r.group.lock();
  if (gp == nullptr) return false;
  Group& g = *gp;
  const absl::Time now = options_.clock->Now();
  if (!g.any_token) {
    g.any_token = true;
    ttft_->Observe(absl::ToDoubleSeconds(now - g.arrival));
    frame_firsts_.push_back(g.inbound);
  } else {
    ++frame_tokens_;
  }
  if (!r.any_token) {
    r.any_token = true;
    r.first_token_at = now;
    load_->FirstToken(now, now - g.arrival, r.spec.prompt_ids_size(), g.cached_tokens[r.index / g.params.n]);
  } else {
    itl_->Observe(absl::ToDoubleSeconds(now - r.last_token_at));
  }
  r.last_token_at = now;
  std::string chunk = r.builder->AddToken(token, g.env, g.params.stream);
  if (g.params.stream && !chunk.empty()) {
    g.out->Event(std::move(chunk));
    p.Add(g.out);
  }
  return r.builder->stopped();
}

void Router::Impl::Cached(RequestTracker::Choice& c, int64_t cached_tokens) {
  Request& r = static_cast<Request&>(c);
  if (GroupPtr g = r.group.lock()) {
    int64_t& cached = g->cached_tokens[r.index / g->params.n];
    cached = std::max(cached, cached_tokens);
  }
}

void Router::Impl::Complete(RequestTracker::Choice& c, proto::FinishReason reason, Pending& p) {
  Request& r = static_cast<Request&>(c);
  GroupPtr g = r.group.lock();
  if (g == nullptr) return;
  if (g->ended) return;
  const std::string why = FinishReasonName(reason);
  g->finish[r.index] = why;
  const size_t n = r.builder->token_ids().size();
  if (n > 1) tpot_->Observe(absl::ToDoubleSeconds(r.last_token_at - r.first_token_at) / (n - 1));
  load_->Finished(options_.clock->Now(), static_cast<int64_t>(n), r.last_token_at - r.first_token_at);
  if (g->params.stream) g->out->Event(r.builder->FinalChunk(g->env, why));
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
  for (int64_t t : g->cached_tokens) cached += t;
  if (g->params.stream) {
    if (g->params.include_usage) {
      int64_t completion = 0;
      for (const RequestTracker::ChoicePtr& x : g->choices) completion += x->builder->completion_tokens();
      g->out->Event(RenderUsageChunk(g->env, prompt, completion, cached));
    }
    g->out->Event("[DONE]");
    g->out->EndStream();
  } else {
    std::vector<ChoiceBuilder*> builders;
    for (const RequestTracker::ChoicePtr& x : g->choices) builders.push_back(x->builder.get());
    g->out->Reply(JsonResponse(200, RenderResponse(g->env, builders, g->finish, prompt, cached)));
  }
}

void Router::Impl::Fail(RequestTracker::Choice& c, const absl::Status& status, Pending& p) {
  GroupPtr g = static_cast<Request&>(c).group.lock();
  if (g == nullptr || g->ended) return;
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

// ---------------------------------------------------------------- worker frames and events

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
      tracker_->OnFirstToken(worker_id, frame.first_token(), p);
      break;
    case proto::Frame::kTokens:
      for (const proto::TokenEvent& ev : frame.tokens().events()) tracker_->OnToken(worker_id, ev, p);
      break;
    case proto::Frame::kFinish:
      tracker_->OnFinish(worker_id, frame.finish(), p);
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
  tracker_->OnWorkerLost(worker_id, reason, p);
  for (auto it = stats_queries_.begin(); it != stats_queries_.end();) {
    StatsQueryPtr q = *it++;
    if (q->waiting.erase(worker_id) > 0 && q->waiting.empty()) FinishStats(q, p);
  }
}

}  // namespace duet::router

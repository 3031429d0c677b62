#include "router/router_impl.h"

#include "absl/strings/numbers.h"
#include "proto/frame.h"

namespace duet::router {

// ---------------------------------------------------------------- /stats

void Router::Impl::HandleStats(http::HttpExchangePtr ex) {
  auto q = std::make_shared<StatsQuery>();
  q->out = std::make_shared<Outbox>(std::move(ex));
  Pending p;
  absl::MutexLock lock(&mu_);
  proto::Frame f = proto::NewFrame();
  f.mutable_stats_request();
  for (const WorkerSnapshot& w : registry_->Snapshot()) {
    if (registry_->Send(w.id, f)) q->waiting.insert(w.id);
  }
  stats_queries_.push_back(q);
  if (q->waiting.empty()) {
    FinishStats(q, p);
    return;
  }
  q->timer = std::make_shared<asio::steady_timer>(control_io_->context());
  q->timer->expires_after(absl::ToChronoMilliseconds(options_.stats_timeout));
  std::weak_ptr<StatsQuery> weak = q;
  // The io thread is joined in Stop, before this Impl goes away.
  q->timer->async_wait([this, weak](boost::system::error_code ec) {
    StatsQueryPtr q = weak.lock();
    if (ec || !q) return;
    Pending p;
    absl::MutexLock lock(&mu_);
    FinishStats(q, p);
  });
}

void Router::Impl::FinishStats(const StatsQueryPtr& q, Pending& p) {
  if (q->done) return;
  q->done = true;
  stats_queries_.remove(q);
  if (q->timer) {
    std::shared_ptr<asio::steady_timer> t = q->timer;
    asio::post(control_io_->context(), [t] { t->cancel(); });
  }
  const absl::Time now = options_.clock->Now();
  Json workers = Json::object();
  for (const WorkerSnapshot& w : registry_->Snapshot()) {
    const proto::WorkerStats& s = w.stats;
    Json j;
    j["role"] = std::string(RoleName(w.role));
    if (w.flex) j["flex"] = true;
    j["control_address"] = w.control_address;
    j["kv_blocks_total"] = s.kv_blocks_total();
    j["kv_blocks_free"] = s.kv_blocks_free();
    j["queued_requests"] = s.queued_requests();
    j["running_requests"] = s.running_requests();
    j["queued_prefill_tokens"] = s.queued_prefill_tokens();
    j["prompt_tokens_computed"] = s.prompt_tokens_computed();
    j["kv_bytes_moved"] = s.kv_bytes_moved();
    j["kv_blocks_transferred"] = s.kv_blocks_transferred();
    j["preemptions"] = s.preemptions();
    j["leased_blocks"] = s.leased_blocks();
    j["prefix_cache_blocks"] = s.prefix_cache_blocks();
    j["requests_dispatched"] = w.dispatched;  // Attempts, re-dispatches included.
    j["attempts_in_flight"] = tracker_->AttemptsOn(w.id);  // Those its loss would move or end.
    j["draining"] = w.draining;
    j["cache_index_blocks"] = cache_index_.blocks(w.id);  // The router's view of its cache.
    j["fresh"] = q->fresh.count(w.id) > 0;  // false: from the last heartbeat.
    j["stats_age_ms"] = absl::ToInt64Milliseconds(now - w.stats_time);
    workers[w.id] = std::move(j);
  }
  Json router;
  router["requests_in_flight"] = static_cast<int64_t>(requests_.size());
  router["requests_unauthorized"] = rejected_auth_.load();
  router["attempts_in_flight"] = static_cast<int64_t>(tracker_->attempts_in_flight());
  router["requests_ok"] = n_ok_;
  router["requests_error"] = n_error_;
  router["requests_cancelled"] = n_cancelled_;
  router["requests_rejected"] = n_rejected_;
  router["redispatches"] = tracker_->redispatches();
  router["migrations"] = tracker_->migrations();
  Json restarts = Json::object();
  for (proto::Role role : {proto::ROLE_PREFILL, proto::ROLE_DECODE, proto::ROLE_COLOCATED}) {
    auto it = n_restarts_.find(std::string(RoleName(role)));
    restarts[std::string(RoleName(role))] = it == n_restarts_.end() ? 0 : it->second;
  }
  router["worker_restarts"] = std::move(restarts);
  router["live_workers"] = static_cast<int64_t>(workers.size());
  router["policy"] = std::string(dispatch::DispatchPolicyName(options_.policy));
  router["cache_index_workers"] = static_cast<int64_t>(cache_index_.workers());
  Json out;
  out["model"] = options_.served_model_name;
  out["workers"] = std::move(workers);
  out["router"] = std::move(router);
  q->out->Reply(JsonResponse(200, out.dump()));
  p.Add(q->out);
}

// ---------------------------------------------------------------- /figures

void Router::Impl::HandleFigures(const http::HttpRequest& req, http::HttpExchangePtr ex) {
  double window_s = 30;
  if (std::optional<std::string> w = http::QueryParam(req.target, "window_s")) {
    if (!absl::SimpleAtod(*w, &window_s) || !(window_s > 0)) {
      ex->Reply(JsonResponse(400, ErrorJson(absl::InvalidArgumentError(
                                      absl::StrCat("window_s must be a positive number of seconds, not '", *w, "'")))));
      return;
    }
  }
  placement::LoadFigures f;
  {
    absl::MutexLock lock(&mu_);
    f = load_->Figures(options_.clock->Now(), absl::Seconds(window_s));
  }
  // The pools from the workers' last heartbeats. Colocated workers are in
  // neither: the planner sizes disaggregated pools.
  for (const WorkerSnapshot& w : registry_->Snapshot()) {
    placement::PoolFigures* p = w.role == proto::ROLE_PREFILL  ? &f.prefill
                                : w.role == proto::ROLE_DECODE ? &f.decode
                                                               : nullptr;
    if (p == nullptr) continue;
    const proto::WorkerStats& s = w.stats;
    (w.draining ? p->draining : p->ready) += 1;
    p->waiting += s.queued_requests();
    p->running += s.running_requests();
    p->kv_used += static_cast<double>((s.kv_blocks_total() - s.kv_blocks_free()) * w.block_size);
    p->kv_capacity += static_cast<double>(s.kv_blocks_total() * w.block_size);
  }
  ex->Reply(JsonResponse(200, placement::FiguresToJson(f).dump()));
}

}  // namespace duet::router

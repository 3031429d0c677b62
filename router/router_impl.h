// Router::Impl and what its files share: the one class behind Router, split
// by concern over router.cc (start, stop, the Router API and flags),
// router_api.cc (the HTTP handlers), router_attempt.cc (worker frames and
// events, and the client side of each choice that RequestTracker, the
// attempt state machine, calls) and router_stats.cc (/stats).
// Private to //router:router.
#ifndef DUET_ROUTER_ROUTER_IMPL_H_
#define DUET_ROUTER_ROUTER_IMPL_H_

#include "router/router.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <cstdlib>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "base/status_macros.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "http/server.h"
#include "router/cache_index.h"
#include "router/completions.h"
#include "router/load_recorder.h"
#include "router/outbox.h"
#include "router/registry.h"
#include "router/request_tracker.h"
#include "spec/model_config.h"
#include "base/io_thread.h"

namespace duet::router {

namespace asio = boost::asio;
using Json = nlohmann::ordered_json;


inline uint64_t RandomU64() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return gen();
}

inline std::string FinishReasonName(proto::FinishReason r) {
  return r == proto::FINISH_LENGTH ? "length" : "stop";
}

inline http::HttpResponse JsonResponse(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// The registry as the request tracker sees it.
class RegistryWorkers : public RequestTracker::Workers {
 public:
  explicit RegistryWorkers(WorkerRegistry* registry) : registry_(registry) {}
  std::vector<dispatch::WorkerLoad> LiveLoads() const override { return registry_->LiveLoads(); }
  bool Send(const std::string& worker_id, const proto::Frame& frame) override {
    return registry_->Send(worker_id, frame);
  }
  WorkerRegistry::Charged Charge(const dispatch::Assignment& a, int64_t tokens, uint64_t request_id) override {
    return registry_->Charge(a, tokens, request_id);
  }
  void Uncharge(const WorkerRegistry::Charged& charged) override { registry_->Uncharge(charged); }

 private:
  WorkerRegistry* const registry_;
};

class Router::Impl : public RegistryListener, public RequestTracker::Client {
 public:
  ~Impl() override { Stop(); }

  absl::Status Start(RouterOptions options);
  void Stop();

  int http_port() const { return http_ ? http_->port() : 0; }
  std::string control_address() const { return registry_ ? registry_->address() : ""; }
  const std::string& served_model_name() const { return options_.served_model_name; }

  // RegistryListener.
  void OnWorkerLive(const std::string& worker_id, proto::Role role, bool restarted) override;
  void OnWorkerLost(const std::string& worker_id, proto::Role role, const std::string& reason) override;
  void OnWorkerFrame(const std::string& worker_id, proto::Frame frame) override;
  void HandleFrame(const std::string& worker_id, proto::Frame& frame, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // RequestTracker::Client, called under mu_ (the tracker is only called
  // under it).
  bool Deliver(RequestTracker::Choice& c, const proto::Token& token, Pending& p) override;
  void Cached(RequestTracker::Choice& c, int64_t cached_tokens) override;
  void Complete(RequestTracker::Choice& c, proto::FinishReason reason, Pending& p) override;
  void Fail(RequestTracker::Choice& c, const absl::Status& status, Pending& p) override;

 private:
  struct Group;
  using GroupPtr = std::shared_ptr<Group>;
  // One choice of a client request: its attempts are the tracker's; what
  // the client sees of it is here.
  struct Request : RequestTracker::Choice {
    // Weak: the group owns its choices (a strong pointer back would keep
    // both, and the client's connection, alive forever).
    std::weak_ptr<Group> group;
    int index = 0;  // The choice's index; its finish reason is the group's.
    absl::Time first_token_at, last_token_at;
    bool any_token = false;
  };
  using RequestPtr = std::shared_ptr<Request>;

  // One client request: n choices of each of its prompts and the client's
  // answer channel.
  struct Group {
    uint64_t seq = 0;
    CompletionRequest params;
    ResponseEnvelope env;
    OutboxPtr out;
    std::vector<RequestTracker::ChoicePtr> choices;  // Each a Request.
    std::vector<std::string> finish;  // Per choice, once it is done.
    int remaining = 0;
    bool ended = false;
    absl::Time arrival;
    bool any_token = false;
    int64_t prompt_tokens = 0;  // Over its prompts.
    // Per prompt: the tokens a prefill cache supplied (the most any attempt
    // reported).
    std::vector<int64_t> cached_tokens;
    // The router's own time on this request before the workers had it.
    absl::Duration inbound;
  };

  struct StatsQuery {
    OutboxPtr out;
    std::set<std::string> waiting, fresh;
    bool done = false;
    std::shared_ptr<asio::steady_timer> timer;
  };
  using StatsQueryPtr = std::shared_ptr<StatsQuery>;

  void Handle(http::HttpRequest req, http::HttpExchangePtr ex);
  void HandleCompletion(http::HttpRequest req, http::HttpExchangePtr ex, ApiKind kind);
  // 401 unless the request carries the API key (when one is set).
  bool Authorized(const http::HttpRequest& req, const http::HttpExchangePtr& ex);
  void HandleStats(http::HttpExchangePtr ex);
  // GET /figures?window_s=S: the load of the last S seconds (default 30) and
  // the pools, for `duet planner` (placement::FiguresToJson).
  void HandleFigures(const http::HttpRequest& req, http::HttpExchangePtr ex);
  void HandleResetPrefixCache(http::HttpExchangePtr ex);
  void HandleSwitchRole(const http::HttpRequest& req, http::HttpExchangePtr ex);
  void HandleHealth(http::HttpExchangePtr ex);
  Json ModelJson() const;  // The served model, as /v1/models lists it.
  void HandleModels(http::HttpExchangePtr ex);
  void HandleModel(const std::string& id, http::HttpExchangePtr ex);  // GET /v1/models/{id}
  void OnClientGone(uint64_t seq);

  // Every running choice of `g` ends on the workers; `g` is no longer tracked.
  void DropGroup(const GroupPtr& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishStats(const StatsQueryPtr& q, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RouterOptions options_;
  // The io threads come first so they are destroyed last: servers,
  // connections and exchanges all refer to their contexts.
  std::unique_ptr<IoThread> control_io_;
  std::unique_ptr<IoThread> http_io_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<grammar::LazyGrammarCache> grammars_;  // Over tokenizer_'s vocabulary.
  text::PromptFormat format_;
  ServedModel served_;
  // config.json as the router reads it (spec::ModelConfig::ServingFromFile):
  // the EOS ids and context the finish rule needs on a redispatch.
  spec::ModelConfig config_;
  int64_t created_ = 0;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<http::HttpServer> http_;
  bool started_ = false;

  Histogram* ttft_ = nullptr;
  Histogram* tpot_ = nullptr;
  Histogram* e2e_ = nullptr;
  Histogram* itl_ = nullptr;
  Histogram* overhead_request_ = nullptr;
  Histogram* overhead_token_ = nullptr;
  Counter* frame_seconds_ = nullptr;
  Counter* frame_tokens_total_ = nullptr;
  Counter* total_ok_ = nullptr;
  Counter* total_error_ = nullptr;
  Counter* total_cancelled_ = nullptr;
  Counter* total_rejected_ = nullptr;
  Counter* total_migrated_ = nullptr;
  std::map<std::string, Counter*> restarts_total_;  // By role name.

  absl::Mutex mu_;
  // Where the workers' prefix caches hold which prefixes (from their
  // CacheEvents), and the policy that reads it.
  CacheIndex cache_index_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<dispatch::Dispatcher> dispatcher_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RegistryWorkers> tracked_workers_;
  std::unique_ptr<RequestTracker> tracker_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, GroupPtr> requests_ ABSL_GUARDED_BY(mu_);  // By client sequence number.
  std::list<StatsQueryPtr> stats_queries_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<LoadRecorder> load_ ABSL_GUARDED_BY(mu_);  // For /figures.
  // Router-local totals for /stats (the metrics registry is process-wide).
  int64_t n_ok_ ABSL_GUARDED_BY(mu_) = 0, n_error_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_cancelled_ ABSL_GUARDED_BY(mu_) = 0, n_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> n_restarts_ ABSL_GUARDED_BY(mu_);  // By role name.
  // What the frame being handled delivered: first tokens (with their
  // requests' inbound time) and later tokens.
  std::vector<absl::Duration> frame_firsts_ ABSL_GUARDED_BY(mu_);
  int64_t frame_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> rejected_auth_{0};
  std::string system_fingerprint_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_ROUTER_IMPL_H_

// Router::Impl and what its files share: the one class behind Router, split
// by concern over router.cc (start, stop, the Router API and flags),
// router_api.cc (the HTTP handlers), router_attempt.cc (the per-request
// attempt state machine and worker frames) and router_stats.cc (/stats).
// Private to //router:router.
#ifndef DUET_ROUTER_ROUTER_IMPL_H_
#define DUET_ROUTER_ROUTER_IMPL_H_

#include "router/router.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <cstdlib>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <utility>
#include <variant>
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
#include "router/registry.h"
#include "spec/generation.h"
#include "spec/generation_spec.h"
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

// One client's answer channel. Ops are queued under the router's lock (so
// they are in state-machine order) and sent by Flush outside it (so no
// HttpExchange call ever runs under the lock). Whoever flushes first sends
// everything queued, including ops others queue meanwhile.
class Outbox {
 public:
  explicit Outbox(http::HttpExchangePtr ex) : ex_(std::move(ex)) {}

  void Reply(http::HttpResponse r) { Push(std::move(r)); }
  void StartStream() { Push(Start{}); }
  void Event(std::string data) { Push(std::move(data)); }
  void EndStream() { Push(End{}); }

  void Flush() {
    absl::MutexLock lock(&mu_);
    if (flushing_) return;
    flushing_ = true;
    while (!ops_.empty()) {
      Op op = std::move(ops_.front());
      ops_.pop_front();
      mu_.Unlock();
      Run(op);
      mu_.Lock();
    }
    flushing_ = false;
  }

  const http::HttpExchangePtr& exchange() const { return ex_; }

 private:
  struct Start {};
  struct End {};
  using Op = std::variant<http::HttpResponse, Start, std::string, End>;

  void Push(Op op) {
    absl::MutexLock lock(&mu_);
    ops_.push_back(std::move(op));
  }
  void Run(Op& op) {
    if (auto* r = std::get_if<http::HttpResponse>(&op)) {
      ex_->Reply(std::move(*r));
    } else if (std::holds_alternative<Start>(op)) {
      ex_->StartStream();
    } else if (auto* e = std::get_if<std::string>(&op)) {
      ex_->SendEvent(*e);
    } else {
      ex_->EndStream();
    }
  }

  const http::HttpExchangePtr ex_;
  absl::Mutex mu_;
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
};
using OutboxPtr = std::shared_ptr<Outbox>;

// Outboxes touched under the lock, flushed after it is released.
// Declare one before taking the lock: it flushes when it goes out of scope,
// after the lock's scope has ended.
class Pending {
 public:
  void Add(const OutboxPtr& out) { outs_.push_back(out); }
  void Flush() {
    for (auto& o : outs_) o->Flush();
    outs_.clear();
  }
  ~Pending() { Flush(); }

 private:
  std::vector<OutboxPtr> outs_;
};

class Router::Impl : public RegistryListener {
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

 private:
  struct Group;
  using GroupPtr = std::shared_ptr<Group>;
  // One choice of a client request: the unit the workers run. Its attempts
  // share it.
  struct Request {
    // Weak: the group owns its choices (a strong pointer back would keep
    // both, and the client's connection, alive forever).
    std::weak_ptr<Group> group;
    int index = 0;                   // The choice's index.
    proto::GenerationSpec spec;      // The group's, with choice_index = index.
    std::unique_ptr<ChoiceBuilder> builder;
    bool done = false;               // Finished (its finish reason is in the group).
    int attempts = 0;
    int migrations = 0;  // Attempts started because a decode was lost.
    // The current attempt.
    uint64_t attempt_id = 0;
    std::string prefill_id, decode_id;
    // What the attempt charged to its prefill's queue (registry Charge), taken
    // back when its first token shows the prefill done.
    WorkerRegistry::Charged charged;
    bool first_token = false;
    // The decode has sent something for this attempt: it pulled the KV.
    bool decode_heard = false;
    // Decode events that overtook the prefill's FirstToken (they travel on
    // different connections); replayed once it arrives.
    std::vector<std::variant<proto::Token, proto::Finish>> held;
    std::string last_failure;
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
    std::vector<RequestPtr> choices;
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
  void HandleResetPrefixCache(http::HttpExchangePtr ex);
  void HandleHealth(http::HttpExchangePtr ex);
  Json ModelJson() const;  // The served model, as /v1/models lists it.
  void HandleModels(http::HttpExchangePtr ex);
  void HandleModel(const std::string& id, http::HttpExchangePtr ex);  // GET /v1/models/{id}
  void OnClientGone(uint64_t seq);

  // State machine; all under mu_.
  absl::Status StartAttempt(const RequestPtr& r, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first attempt of every choice of a new request: per prompt, one
  // PrefillRequest whose sibling ids name its choices 2..n, so each prompt
  // is computed once.
  absl::Status StartGroup(const GroupPtr& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Choices first..first+n-1 of `g`, one prompt's.
  absl::Status StartPrompt(const GroupPtr& g, size_t first, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Redispatch(const RequestPtr& r, const std::string& reason, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const RequestPtr& r, const proto::Token& token, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyFinish(const RequestPtr& r, const proto::Finish& fin, const std::string& from, Pending& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(const RequestPtr& r, proto::FinishReason reason, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const RequestPtr& r, const absl::Status& status, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailGroup(const GroupPtr& g, const absl::Status& status, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const RequestPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every running choice of `g` on the workers and stops tracking it.
  void DropGroup(const GroupPtr& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendCancel(const RequestPtr& r, const std::string& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RequestPtr FindAttempt(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFirstToken(const std::string& from, const proto::FirstToken& ft, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnToken(const std::string& from, const proto::TokenEvent& ev, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinish(const std::string& from, const proto::Finish& fin, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishStats(const StatsQueryPtr& q, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RouterOptions options_;
  // The io threads come first so they are destroyed last: servers,
  // connections and exchanges all refer to their contexts.
  std::unique_ptr<IoThread> control_io_;
  std::unique_ptr<IoThread> http_io_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
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
  uint64_t next_attempt_id_ ABSL_GUARDED_BY(mu_) = 1;  // Set by Start.
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, RequestPtr> attempts_ ABSL_GUARDED_BY(mu_);  // By attempt (request_id).
  std::map<uint64_t, GroupPtr> requests_ ABSL_GUARDED_BY(mu_);  // By client sequence number.
  std::list<StatsQueryPtr> stats_queries_ ABSL_GUARDED_BY(mu_);
  // Router-local totals for /stats (the metrics registry is process-wide).
  int64_t n_ok_ ABSL_GUARDED_BY(mu_) = 0, n_error_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_cancelled_ ABSL_GUARDED_BY(mu_) = 0, n_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_redispatched_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_migrated_ ABSL_GUARDED_BY(mu_) = 0;
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

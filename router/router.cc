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
#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "http/server.h"
#include "router/completions.h"
#include "router/registry.h"
#include "base/io_thread.h"

namespace duet::router {

namespace asio = boost::asio;
using Json = nlohmann::ordered_json;

namespace {

proto::Frame NewFrame() {
  proto::Frame f;
  f.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  return f;
}

uint64_t RandomU64() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return gen();
}

std::string FinishReasonName(proto::FinishReason r) {
  return r == proto::FINISH_LENGTH ? "length" : "stop";
}

http::HttpResponse JsonResponse(int status, std::string body) {
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

// What the router needs of config.json: the context and the embedding rows.
struct ModelShape {
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;
};

absl::StatusOr<ModelShape> ReadModelShape(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  Json cfg = Json::parse(ss.str(), nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  ModelShape shape;
  for (auto [field, out] : {std::pair<const char*, int64_t*>{"max_position_embeddings", &shape.max_position_embeddings},
                            std::pair<const char*, int64_t*>{"vocab_size", &shape.vocab_size}}) {
    auto it = cfg.find(field);
    if (it == cfg.end() || !it->is_number_integer() || it->get<int64_t>() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", field, "\" is missing or not a positive integer"));
    }
    *out = it->get<int64_t>();
  }
  return shape;
}

}  // namespace

class Router::Impl : public RegistryListener {
 public:
  ~Impl() override { Stop(); }

  absl::Status Start(RouterOptions options);
  void Stop();

  int http_port() const { return http_ ? http_->port() : 0; }
  std::string control_address() const { return registry_ ? registry_->address() : ""; }
  const std::string& served_model_name() const { return options_.served_model_name; }

  // RegistryListener.
  void OnWorkerLive(const std::string& worker_id, proto::Role role) override;
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
    // The current attempt.
    uint64_t attempt_id = 0;
    std::string prefill_id, decode_id;
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

  // One client request: n choices and the client's answer channel.
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
  void HandleHealth(http::HttpExchangePtr ex);
  void HandleModels(http::HttpExchangePtr ex);
  void OnClientGone(uint64_t seq);

  // State machine; all under mu_.
  absl::Status StartAttempt(const RequestPtr& r, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first attempt of every choice of a new request: one PrefillRequest
  // whose sibling ids name choices 2..n, so the prompt is computed once.
  absl::Status StartGroup(const GroupPtr& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::unique_ptr<engine::Tokenizer> tokenizer_;
  engine::PromptFormat format_;
  ServedModel served_;
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

  absl::Mutex mu_;
  Dispatcher dispatcher_ ABSL_GUARDED_BY(mu_){DispatchPolicy::kLeastLoaded};
  uint64_t next_attempt_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, RequestPtr> attempts_ ABSL_GUARDED_BY(mu_);  // By attempt (request_id).
  std::map<uint64_t, GroupPtr> requests_ ABSL_GUARDED_BY(mu_);  // By client sequence number.
  std::list<StatsQueryPtr> stats_queries_ ABSL_GUARDED_BY(mu_);
  // Router-local totals for /stats (the metrics registry is process-wide).
  int64_t n_ok_ ABSL_GUARDED_BY(mu_) = 0, n_error_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_cancelled_ ABSL_GUARDED_BY(mu_) = 0, n_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_redispatched_ ABSL_GUARDED_BY(mu_) = 0;
  // What the frame being handled delivered: first tokens (with their
  // requests' inbound time) and later tokens.
  std::vector<absl::Duration> frame_firsts_ ABSL_GUARDED_BY(mu_);
  int64_t frame_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> rejected_auth_{0};
  std::string system_fingerprint_;
};

absl::Status Router::Impl::Start(RouterOptions options) {
  if (started_) return absl::FailedPreconditionError("the router is already started");
  options_ = std::move(options);
  if (options_.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (options_.served_model_name.empty()) {
    std::filesystem::path p(options_.model_dir);
    if (!p.has_filename()) p = p.parent_path();
    options_.served_model_name = p.filename().string();
  }
  ASSIGN_OR_RETURN(tokenizer_, engine::Tokenizer::Load(options_.model_dir));
  ASSIGN_OR_RETURN(format_, engine::PromptFormat::Load(options_.model_dir));
  ASSIGN_OR_RETURN(ModelShape shape, ReadModelShape(options_.model_dir));
  const int64_t context = options_.max_model_len > 0 ? options_.max_model_len : shape.max_position_embeddings;
  served_ = ServedModel{.name = options_.served_model_name,
                        .tokenizer = tokenizer_.get(),
                        .format = &format_,
                        .max_model_len = context,
                        .vocab_size = shape.vocab_size};
  created_ = absl::ToUnixSeconds(absl::Now());
  // Names this build and model, as OpenAI's field does its backend config.
  system_fingerprint_ = absl::StrFormat(
      "fp_duet_%010x", std::hash<std::string>{}(absl::StrCat("duet/1 ", options_.served_model_name, " ",
                                                             tokenizer_->vocab_size(), " ", context)) &
                           0xffffffffffull);
  {
    absl::MutexLock lock(&mu_);
    dispatcher_ = Dispatcher(options_.policy);
  }

  MetricsRegistry& m = MetricsRegistry::Default();
  const Labels model = {{"model", options_.served_model_name}};
  ttft_ = m.GetHistogram("duet_time_to_first_token_seconds", "Time to first token", model, LatencyBucketsSeconds());
  tpot_ = m.GetHistogram("duet_time_per_output_token_seconds", "Time per output token after the first", model,
                         TokenBucketsSeconds());
  itl_ = m.GetHistogram("duet_inter_token_latency_seconds", "Time between consecutive tokens of a choice", model,
                        TokenBucketsSeconds());
  const std::vector<double> overhead_buckets = {2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                1e-3,   2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1};
  overhead_request_ = m.GetHistogram("duet_router_overhead_seconds",
                                     "The router's own time: per request (parse, tokenize, dispatch, first "
                                     "event) and per later streamed token (frame to client event)",
                                     {{"stage", "request"}}, overhead_buckets);
  overhead_token_ = m.GetHistogram("duet_router_overhead_seconds",
                                   "The router's own time: per request (parse, tokenize, dispatch, first event) "
                                   "and per later streamed token (frame to client event)",
                                   {{"stage", "token"}}, overhead_buckets);
  frame_seconds_ = m.GetCounter("duet_router_token_frame_seconds_total",
                                "Time the router spent handling workers' token frames");
  frame_tokens_total_ = m.GetCounter("duet_router_token_frame_tokens_total",
                                     "Tokens in the workers' frames the router handled");
  e2e_ = m.GetHistogram("duet_e2e_request_latency_seconds", "Request latency, arrival to last token", model,
                        LatencyBucketsSeconds());
  const char* kTotalHelp = "Completion requests by outcome";
  total_ok_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "ok"}});
  total_error_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "error"}});
  total_cancelled_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "cancelled"}});
  total_rejected_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "rejected"}});

  control_io_ = std::make_unique<IoThread>();
  // One thread for both: no hand-off (and no wake-up) between a worker's
  // token frame and the client writes it causes. Two: HTTP parsing and
  // control traffic on their own cores.
  if (options_.io_threads > 1) http_io_ = std::make_unique<IoThread>();
  registry_ = std::make_unique<WorkerRegistry>(
      control_io_->context(),
      RegistryOptions{.listen = options_.control_listen,
                      .model = options_.served_model_name,
                      .heartbeat_interval = options_.heartbeat_interval,
                      .missed_heartbeats = options_.missed_heartbeats,
                      .connect_timeout = options_.connect_timeout,
                      .clock = options_.clock},
      this);
  started_ = true;
  RETURN_IF_ERROR(registry_->Start());
  auto http = http::HttpServer::Start(
      http_io_ ? http_io_->context() : control_io_->context(), options_.http_listen,
      [this](http::HttpRequest req, http::HttpExchangePtr ex) { Handle(std::move(req), std::move(ex)); },
      options_.http_limits);
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  LOG(INFO) << "router serving model \"" << options_.served_model_name << "\" (context " << context
            << ") on HTTP port " << http_->port() << ", control " << registry_->address() << ", policy "
            << DispatchPolicyName(options_.policy);
  return absl::OkStatus();
}

void Router::Impl::Stop() {
  if (!started_) return;
  started_ = false;
  if (http_) http_->Stop();
  registry_->Stop();
  control_io_->Stop();
  if (http_io_) http_io_->Stop();
  // Exchanges must go before the contexts they post to.
  std::map<uint64_t, GroupPtr> requests;
  std::list<StatsQueryPtr> queries;
  {
    absl::MutexLock lock(&mu_);
    requests.swap(requests_);
    attempts_.clear();
    queries.swap(stats_queries_);
  }
  requests.clear();
  queries.clear();
  http_.reset();
  registry_.reset();
}

// ---------------------------------------------------------------- HTTP

void Router::Impl::Handle(http::HttpRequest req, http::HttpExchangePtr ex) {
  const std::string& path = req.path;
  auto method_is = [&](const char* m) {
    if (req.method == m) return true;
    ex->Reply(JsonResponse(405, ErrorJson(absl::InvalidArgumentError(
                                    absl::StrCat("method ", req.method, " is not allowed on ", path)))));
    return false;
  };
  if (path == "/v1/completions") {
    if (method_is("POST") && Authorized(req, ex)) HandleCompletion(std::move(req), std::move(ex), ApiKind::kCompletion);
  } else if (path == "/v1/chat/completions") {
    if (method_is("POST") && Authorized(req, ex)) HandleCompletion(std::move(req), std::move(ex), ApiKind::kChat);
  } else if (path == "/v1/models") {
    if (method_is("GET") && Authorized(req, ex)) HandleModels(std::move(ex));
  } else if (path == "/health") {
    if (method_is("GET")) HandleHealth(std::move(ex));
  } else if (path == "/stats") {
    if (method_is("GET")) HandleStats(std::move(ex));
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

void Router::Impl::HandleModels(http::HttpExchangePtr ex) {
  Json model;
  model["id"] = options_.served_model_name;
  model["object"] = "model";
  model["created"] = created_;
  model["owned_by"] = "duet";
  model["max_model_len"] = served_.max_model_len;
  Json out;
  out["object"] = "list";
  out["data"] = Json::array({std::move(model)});
  ex->Reply(JsonResponse(200, out.dump()));
}

void Router::Impl::HandleHealth(http::HttpExchangePtr ex) {
  absl::Status s = CanServe(registry_->LiveLoads());
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
  for (int i = 0; i < g->params.n; ++i) {
    auto r = std::make_shared<Request>();
    r->group = g;
    r->index = i;
    r->spec = g->params.spec;
    r->spec.set_choice_index(static_cast<uint32_t>(i));
    r->builder = std::make_unique<ChoiceBuilder>(tokenizer_.get(), g->params, i);
    g->choices.push_back(std::move(r));
  }
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
    if (s.ok()) s = StartGroup(g);
    if (!s.ok()) {
      for (const RequestPtr& r : g->choices) {
        if (r->attempts > 0) SendCancel(r, "");
        attempts_.erase(r->attempt_id);
      }
      ++n_rejected_;
      total_rejected_->Increment();
      http::HttpResponse resp = JsonResponse(HttpStatusFor(s), ErrorJson(s));
      if (resp.status == 429 || resp.status == 503) resp.headers.push_back({"Retry-After", "1"});
      g->out->Reply(std::move(resp));
    } else {
      seq = g->seq;
      requests_[seq] = g;
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
  for (const RequestPtr& r : g->choices) {
    if (r->done) continue;
    r->done = true;
    if (attempts_.erase(r->attempt_id) > 0) SendCancel(r, "");
  }
  requests_.erase(g->seq);
}

// ---------------------------------------------------------------- state machine

Router::Impl::RequestPtr Router::Impl::FindAttempt(uint64_t id) {
  auto it = attempts_.find(id);
  return it == attempts_.end() ? nullptr : it->second;
}

absl::Status Router::Impl::StartAttempt(const RequestPtr& r, Pending& p) {
  if (r->attempts >= options_.max_attempts) {
    return absl::UnavailableError(absl::StrCat("the request failed after ", r->attempts,
                                               " attempts; the last failure: ", r->last_failure));
  }
  const std::vector<int32_t>& resume = r->builder->token_ids();
  // The registry may lose the picked worker between LiveLoads and Send; pick again.
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatcher_.Pick(registry_->LiveLoads());
    if (!a.ok()) return a.status();
    const uint64_t id = next_attempt_id_++;
    proto::Frame f = NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    pr->set_request_id(id);
    *pr->mutable_spec() = r->spec;
    pr->mutable_resume_ids()->Assign(resume.begin(), resume.end());
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!registry_->Send(a->prefill_id, f)) continue;
    registry_->Charge(*a, r->spec.prompt_ids_size() + static_cast<int64_t>(resume.size()));
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
  for (int tries = 0; tries < 3; ++tries) {
    auto a = dispatcher_.Pick(registry_->LiveLoads());
    if (!a.ok()) return a.status();
    proto::Frame f = NewFrame();
    proto::PrefillRequest* pr = f.mutable_prefill();
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < g->choices.size(); ++i) ids.push_back(next_attempt_id_++);
    pr->set_request_id(ids[0]);
    *pr->mutable_spec() = g->choices[0]->spec;
    for (size_t i = 1; i < ids.size(); ++i) pr->add_sibling_request_ids(ids[i]);
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!registry_->Send(a->prefill_id, f)) continue;
    registry_->Charge(*a, g->choices[0]->spec.prompt_ids_size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestPtr& r = g->choices[i];
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
  attempts_.erase(r->attempt_id);
  r->last_failure = reason;
  if (static_cast<int64_t>(r->builder->token_ids().size()) >= r->spec.max_tokens()) {
    Complete(r, proto::FINISH_LENGTH, p);  // Nothing is left to generate.
    return;
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
  proto::Frame f = NewFrame();
  f.mutable_cancel()->set_request_id(r->attempt_id);
  if (r->prefill_id != except) registry_->Send(r->prefill_id, f);
  if (r->decode_id != except && r->decode_id != r->prefill_id) registry_->Send(r->decode_id, f);
}

void Router::Impl::Forget(const RequestPtr& r) { attempts_.erase(r->attempt_id); }

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
  const int64_t prompt = g->params.spec.prompt_ids_size();
  if (g->params.stream) {
    if (g->params.include_usage) {
      int64_t completion = 0;
      for (const RequestPtr& c : g->choices) completion += c->builder->completion_tokens();
      g->out->Event(RenderUsageChunk(g->env, prompt, completion));
    }
    g->out->Event("[DONE]");
    g->out->EndStream();
  } else {
    std::vector<ChoiceBuilder*> builders;
    for (const RequestPtr& c : g->choices) builders.push_back(c->builder.get());
    g->out->Reply(JsonResponse(200, RenderResponse(g->env, builders, g->finish, prompt)));
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

void Router::Impl::OnWorkerLive(const std::string& worker_id, proto::Role role) {}

void Router::Impl::OnWorkerLost(const std::string& worker_id, proto::Role role, const std::string& reason) {
  Pending p;
  absl::MutexLock lock(&mu_);
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
      Fail(r, absl::UnavailableError(absl::StrCat("decode worker ", worker_id, " was lost (", reason, ")")), p);
    }
  }
  for (auto it = stats_queries_.begin(); it != stats_queries_.end();) {
    StatsQueryPtr q = *it++;
    if (q->waiting.erase(worker_id) > 0 && q->waiting.empty()) FinishStats(q, p);
  }
}

// ---------------------------------------------------------------- /stats

void Router::Impl::HandleStats(http::HttpExchangePtr ex) {
  auto q = std::make_shared<StatsQuery>();
  q->out = std::make_shared<Outbox>(std::move(ex));
  Pending p;
  absl::MutexLock lock(&mu_);
  proto::Frame f = NewFrame();
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
    j["fresh"] = q->fresh.count(w.id) > 0;  // false: from the last heartbeat.
    j["stats_age_ms"] = absl::ToInt64Milliseconds(now - w.stats_time);
    workers[w.id] = std::move(j);
  }
  Json router;
  router["requests_in_flight"] = static_cast<int64_t>(requests_.size());
  router["requests_unauthorized"] = rejected_auth_.load();
  router["attempts_in_flight"] = static_cast<int64_t>(attempts_.size());
  router["requests_ok"] = n_ok_;
  router["requests_error"] = n_error_;
  router["requests_cancelled"] = n_cancelled_;
  router["requests_rejected"] = n_rejected_;
  router["redispatches"] = n_redispatched_;
  router["live_workers"] = static_cast<int64_t>(workers.size());
  router["policy"] = std::string(DispatchPolicyName(options_.policy));
  Json out;
  out["model"] = options_.served_model_name;
  out["workers"] = std::move(workers);
  out["router"] = std::move(router);
  q->out->Reply(JsonResponse(200, out.dump()));
  p.Add(q->out);
}

// ---------------------------------------------------------------- Router

Router::Router() : impl_(std::make_unique<Impl>()) {}
Router::~Router() = default;
absl::Status Router::Start(RouterOptions options) { return impl_->Start(std::move(options)); }
void Router::Stop() { impl_->Stop(); }
int Router::http_port() const { return impl_->http_port(); }
std::string Router::control_address() const { return impl_->control_address(); }
const std::string& Router::served_model_name() const { return impl_->served_model_name(); }

void AddRouterFlags(FlagSet& f) {
  f.String("model", "", "model directory (tokenizer and config; no weights needed)");
  f.String("served-model-name", "", "the model name clients send (default: the directory's name)");
  f.String("listen", "0.0.0.0:8000", "HOST:PORT of the OpenAI HTTP API");
  f.String("control-listen", "0.0.0.0:7000", "HOST:PORT workers register on");
  f.String("policy", "least_loaded", "dispatch policy: least_loaded | round_robin");
  f.Int("heartbeat-ms", 500, "heartbeat interval workers are held to");
  f.Int("missed-heartbeats", 10, "heartbeats a worker may miss before it is dropped");
  f.Int("max-attempts", 3, "attempts per request across worker failures");
  f.Int("max-model-len", 0, "context in tokens (0: config.json's max_position_embeddings)");
  f.Int("io-threads", 1, "network threads: 1 (HTTP and control plane share one) or 2");
  f.String("api-key", "", "require 'Authorization: Bearer KEY' on /v1/ endpoints (also $DUET_API_KEY)");
  f.String("api-key-file", "", "read the API key from this file (first line), instead of --api-key");
  f.Int("max-requests", 4096, "client requests in flight; more get 429 with Retry-After");
  f.Int("max-body-bytes", 4 << 20, "largest request body; larger gets 413");
  f.Int("max-header-bytes", 16 << 10, "largest request header block; larger gets 431");
  f.Int("max-connections", 1024, "open client connections; more get 503");
  f.Int("header-timeout-s", 10, "seconds a client may take to send its headers");
  f.Int("idle-timeout-s", 60, "seconds a keep-alive connection may sit idle");
}

absl::StatusOr<RouterOptions> RouterOptionsFromFlags(const FlagSet& f) {
  RouterOptions o;
  o.model_dir = f.GetString("model");  // Empty: the caller picks a default (Start requires one).
  o.served_model_name = f.GetString("served-model-name");
  o.http_listen = f.GetString("listen");
  o.control_listen = f.GetString("control-listen");
  ASSIGN_OR_RETURN(o.policy, ParseDispatchPolicy(f.GetString("policy")));
  if (f.GetInt("heartbeat-ms") < 1) return absl::InvalidArgumentError("--heartbeat-ms must be >= 1");
  o.heartbeat_interval = absl::Milliseconds(f.GetInt("heartbeat-ms"));
  if (f.GetInt("missed-heartbeats") < 1) return absl::InvalidArgumentError("--missed-heartbeats must be >= 1");
  o.missed_heartbeats = static_cast<int>(f.GetInt("missed-heartbeats"));
  if (f.GetInt("max-attempts") < 1) return absl::InvalidArgumentError("--max-attempts must be >= 1");
  o.max_attempts = static_cast<int>(f.GetInt("max-attempts"));
  if (f.GetInt("max-model-len") < 0) return absl::InvalidArgumentError("--max-model-len must be >= 0");
  o.max_model_len = f.GetInt("max-model-len");
  o.api_key = f.GetString("api-key");
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("DUET_API_KEY")) o.api_key = env;
  }
  if (!f.GetString("api-key-file").empty()) {
    if (!f.GetString("api-key").empty()) {
      return absl::InvalidArgumentError("give --api-key or --api-key-file, not both");
    }
    std::ifstream in(f.GetString("api-key-file"));
    if (!in) return absl::NotFoundError(absl::StrCat("--api-key-file: cannot read ", f.GetString("api-key-file")));
    std::getline(in, o.api_key);
    while (!o.api_key.empty() && (o.api_key.back() == '\r' || o.api_key.back() == ' ')) o.api_key.pop_back();
    if (o.api_key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--api-key-file: ", f.GetString("api-key-file"), " is empty"));
    }
  }
  for (const char* name : {"max-requests", "max-body-bytes", "max-header-bytes", "max-connections",
                           "header-timeout-s", "idle-timeout-s"}) {
    if (f.GetInt(name) < 1) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 1"));
  }
  o.max_requests = f.GetInt("max-requests");
  if (f.GetInt("io-threads") != 1 && f.GetInt("io-threads") != 2) {
    return absl::InvalidArgumentError("--io-threads must be 1 or 2");
  }
  o.io_threads = static_cast<int>(f.GetInt("io-threads"));
  o.http_limits.max_body_bytes = static_cast<size_t>(f.GetInt("max-body-bytes"));
  o.http_limits.max_header_bytes = static_cast<size_t>(f.GetInt("max-header-bytes"));
  o.http_limits.max_connections = static_cast<int>(f.GetInt("max-connections"));
  o.http_limits.header_timeout = absl::Seconds(f.GetInt("header-timeout-s"));
  o.http_limits.idle_timeout = absl::Seconds(f.GetInt("idle-timeout-s"));
  return o;
}

}  // namespace duet::router

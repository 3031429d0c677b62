#include "router/router.h"

#include <boost/asio/post.hpp>
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

#include "absl/strings/str_cat.h"
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
#include "rpc/io_thread.h"

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

 private:
  // One client request; its attempts share it.
  struct Request {
    uint64_t seq = 0;
    CompletionRequest params;
    std::unique_ptr<CompletionBuilder> builder;
    OutboxPtr out;
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
    absl::Time arrival, first_token_at, last_token_at;
    bool any_token = false;
  };
  using RequestPtr = std::shared_ptr<Request>;

  struct StatsQuery {
    OutboxPtr out;
    std::set<std::string> waiting, fresh;
    bool done = false;
    std::shared_ptr<asio::steady_timer> timer;
  };
  using StatsQueryPtr = std::shared_ptr<StatsQuery>;

  void Handle(http::HttpRequest req, http::HttpExchangePtr ex);
  void HandleCompletion(http::HttpRequest req, http::HttpExchangePtr ex);
  void HandleStats(http::HttpExchangePtr ex);
  void HandleHealth(http::HttpExchangePtr ex);
  void HandleModels(http::HttpExchangePtr ex);
  void OnClientGone(uint64_t seq);

  // State machine; all under mu_.
  absl::Status StartAttempt(const RequestPtr& r, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Redispatch(const RequestPtr& r, const std::string& reason, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const RequestPtr& r, const proto::Token& token, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyFinish(const RequestPtr& r, const proto::Finish& fin, const std::string& from, Pending& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(const RequestPtr& r, proto::FinishReason reason, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const RequestPtr& r, const absl::Status& status, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const RequestPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendCancel(const RequestPtr& r, const std::string& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RequestPtr FindAttempt(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFirstToken(const std::string& from, const proto::FirstToken& ft, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnToken(const std::string& from, const proto::TokenEvent& ev, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinish(const std::string& from, const proto::Finish& fin, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishStats(const StatsQueryPtr& q, Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RouterOptions options_;
  // The io threads come first so they are destroyed last: servers,
  // connections and exchanges all refer to their contexts.
  std::unique_ptr<rpc::IoThread> control_io_;
  std::unique_ptr<rpc::IoThread> http_io_;
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
  Counter* total_ok_ = nullptr;
  Counter* total_error_ = nullptr;
  Counter* total_cancelled_ = nullptr;
  Counter* total_rejected_ = nullptr;

  absl::Mutex mu_;
  Dispatcher dispatcher_ ABSL_GUARDED_BY(mu_){DispatchPolicy::kLeastLoaded};
  uint64_t next_attempt_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, RequestPtr> attempts_ ABSL_GUARDED_BY(mu_);  // By attempt (request_id).
  std::map<uint64_t, RequestPtr> requests_ ABSL_GUARDED_BY(mu_);  // By client sequence number.
  std::list<StatsQueryPtr> stats_queries_ ABSL_GUARDED_BY(mu_);
  // Router-local totals for /stats (the metrics registry is process-wide).
  int64_t n_ok_ ABSL_GUARDED_BY(mu_) = 0, n_error_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_cancelled_ ABSL_GUARDED_BY(mu_) = 0, n_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_redispatched_ ABSL_GUARDED_BY(mu_) = 0;
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
  {
    absl::MutexLock lock(&mu_);
    dispatcher_ = Dispatcher(options_.policy);
  }

  MetricsRegistry& m = MetricsRegistry::Default();
  const Labels model = {{"model", options_.served_model_name}};
  ttft_ = m.GetHistogram("duet_time_to_first_token_seconds", "Time to first token", model, LatencyBucketsSeconds());
  tpot_ = m.GetHistogram("duet_time_per_output_token_seconds", "Time per output token after the first", model,
                         TokenBucketsSeconds());
  e2e_ = m.GetHistogram("duet_e2e_request_latency_seconds", "Request latency, arrival to last token", model,
                        LatencyBucketsSeconds());
  const char* kTotalHelp = "Completion requests by outcome";
  total_ok_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "ok"}});
  total_error_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "error"}});
  total_cancelled_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "cancelled"}});
  total_rejected_ = m.GetCounter("duet_requests_total", kTotalHelp, {{"status", "rejected"}});

  control_io_ = std::make_unique<rpc::IoThread>();
  http_io_ = std::make_unique<rpc::IoThread>();
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
      http_io_->context(), options_.http_listen,
      [this](http::HttpRequest req, http::HttpExchangePtr ex) { Handle(std::move(req), std::move(ex)); });
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
  http_io_->Stop();
  // Exchanges must go before the contexts they post to.
  std::map<uint64_t, RequestPtr> requests;
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
    if (method_is("POST")) HandleCompletion(std::move(req), std::move(ex));
  } else if (path == "/v1/models") {
    if (method_is("GET")) HandleModels(std::move(ex));
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
    ex->Reply(JsonResponse(404, ErrorJson(absl::NotFoundError(absl::StrCat("no route for ", path)))));
  }
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

void Router::Impl::HandleCompletion(http::HttpRequest req, http::HttpExchangePtr ex) {
  const absl::Time arrival = options_.clock->Now();
  auto parsed = ParseCompletionRequest(req.body, served_, RandomU64());
  if (!parsed.ok()) {
    total_rejected_->Increment();
    {
      absl::MutexLock lock(&mu_);
      ++n_rejected_;
    }
    ex->Reply(JsonResponse(HttpStatusFor(parsed.status()), ErrorJson(parsed.status())));
    return;
  }
  auto r = std::make_shared<Request>();
  r->params = std::move(*parsed);
  r->arrival = arrival;
  r->out = std::make_shared<Outbox>(ex);
  r->builder = std::make_unique<CompletionBuilder>(
      tokenizer_.get(), absl::StrFormat("cmpl-%016x%016x", RandomU64(), RandomU64()),
      absl::ToUnixSeconds(absl::Now()), options_.served_model_name, r->params.logprobs,
      r->params.spec.prompt_ids_size());
  uint64_t seq = 0;
  Pending p;
  {
    absl::MutexLock lock(&mu_);
    r->seq = next_seq_++;
    p.Add(r->out);
    absl::Status s = StartAttempt(r, p);
    if (!s.ok()) {
      ++n_rejected_;
      total_rejected_->Increment();
      r->out->Reply(JsonResponse(HttpStatusFor(s), ErrorJson(s)));
    } else {
      seq = r->seq;
      requests_[seq] = r;
      if (r->params.stream) r->out->StartStream();
    }
  }
  p.Flush();
  if (seq != 0) ex->OnClientGone([this, seq] { OnClientGone(seq); });
}

void Router::Impl::OnClientGone(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(seq);
  if (it == requests_.end()) return;
  RequestPtr r = it->second;
  LOG(INFO) << "client of request " << r->attempt_id << " disconnected; cancelling it";
  SendCancel(r, "");
  Forget(r);
  ++n_cancelled_;
  total_cancelled_->Increment();
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
    *pr->mutable_spec() = r->params.spec;
    pr->mutable_resume_ids()->Assign(resume.begin(), resume.end());
    pr->set_decode_worker_id(a->decode_id);
    pr->set_decode_address(a->decode_address);
    if (!registry_->Send(a->prefill_id, f)) continue;
    registry_->Charge(*a, r->params.spec.prompt_ids_size() + static_cast<int64_t>(resume.size()));
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

void Router::Impl::Redispatch(const RequestPtr& r, const std::string& reason, Pending& p) {
  attempts_.erase(r->attempt_id);
  r->last_failure = reason;
  if (static_cast<int64_t>(r->builder->token_ids().size()) >= r->params.spec.max_tokens()) {
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
  if (static_cast<int64_t>(r->builder->token_ids().size()) >= r->params.spec.max_tokens()) {
    LOG(WARNING) << "attempt " << r->attempt_id << " sent a token past max_tokens; dropped";
    return;
  }
  const absl::Time now = options_.clock->Now();
  if (!r->any_token) {
    r->any_token = true;
    r->first_token_at = now;
    ttft_->Observe(absl::ToDoubleSeconds(now - r->arrival));
  }
  r->last_token_at = now;
  std::string chunk = r->builder->AddToken(token, r->params.stream);
  if (r->params.stream) {
    r->out->Event(std::move(chunk));
    p.Add(r->out);
  }
}

void Router::Impl::SendCancel(const RequestPtr& r, const std::string& except) {
  proto::Frame f = NewFrame();
  f.mutable_cancel()->set_request_id(r->attempt_id);
  if (r->prefill_id != except) registry_->Send(r->prefill_id, f);
  if (r->decode_id != except && r->decode_id != r->prefill_id) registry_->Send(r->decode_id, f);
}

void Router::Impl::Forget(const RequestPtr& r) {
  attempts_.erase(r->attempt_id);
  requests_.erase(r->seq);
}

void Router::Impl::Complete(const RequestPtr& r, proto::FinishReason reason, Pending& p) {
  Forget(r);
  ++n_ok_;
  total_ok_->Increment();
  const absl::Time now = options_.clock->Now();
  e2e_->Observe(absl::ToDoubleSeconds(now - r->arrival));
  const size_t n = r->builder->token_ids().size();
  if (n > 1) tpot_->Observe(absl::ToDoubleSeconds(r->last_token_at - r->first_token_at) / (n - 1));
  const std::string why = FinishReasonName(reason);
  if (r->params.stream) {
    r->out->Event(r->builder->FinalChunk(why));
    if (r->params.include_usage) r->out->Event(r->builder->UsageChunk());
    r->out->Event("[DONE]");
    r->out->EndStream();
  } else {
    r->out->Reply(JsonResponse(200, r->builder->Response(why)));
  }
  p.Add(r->out);
}

void Router::Impl::Fail(const RequestPtr& r, const absl::Status& status, Pending& p) {
  Forget(r);
  ++n_error_;
  total_error_->Increment();
  LOG(WARNING) << "request " << r->attempt_id << " failed: " << status;
  if (r->params.stream) {
    r->out->Event(ErrorJson(status));
    r->out->Event("[DONE]");
    r->out->EndStream();
  } else {
    r->out->Reply(JsonResponse(HttpStatusFor(status), ErrorJson(status)));
  }
  p.Add(r->out);
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
  Pending p;
  absl::MutexLock lock(&mu_);
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
  for (const auto& [seq, r] : requests_) {
    if (r->prefill_id == worker_id || r->decode_id == worker_id) affected.push_back(r);
  }
  for (const RequestPtr& r : affected) {
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
  return o;
}

}  // namespace duet::router

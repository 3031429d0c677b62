#include "router/router_impl.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace duet::router {

absl::Status Router::Impl::Start(RouterOptions options) {
  if (started_) return absl::FailedPreconditionError("the router is already started");
  options_ = std::move(options);
  // Request ids start at the wall clock's microseconds, so a restarted
  // router's ids lie above every one its predecessor sent: a worker that
  // still holds state or frames of those can never mistake them for new ones.
  const uint64_t first_attempt_id = static_cast<uint64_t>(std::max<int64_t>(1, absl::ToUnixMicros(absl::Now())));
  if (options_.model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (options_.served_model_name.empty()) {
    std::filesystem::path p(options_.model_dir);
    if (!p.has_filename()) p = p.parent_path();
    options_.served_model_name = p.filename().string();
  }
  ASSIGN_OR_RETURN(tokenizer_, text::Tokenizer::Load(options_.model_dir));
  ASSIGN_OR_RETURN(format_, text::PromptFormat::Load(options_.model_dir));
  if (!format_.has_chat_template()) {
    LOG(WARNING) << "chat completions are unavailable (" << format_.chat_unavailable()
                 << "); serving /v1/completions only";
  }
  ASSIGN_OR_RETURN(config_, spec::ModelConfig::ServingFromFile(
                                (std::filesystem::path(options_.model_dir) / "config.json").string()));
  grammars_ = std::make_unique<grammar::LazyGrammarCache>(
      [this]() -> absl::StatusOr<std::shared_ptr<const grammar::Vocabulary>> {
        return grammar::Vocabulary::FromTokenizer(*tokenizer_, config_.eos_token_ids);
      },
      /*capacity=*/256);
  const int64_t context = options_.max_model_len > 0 ? options_.max_model_len : config_.max_position_embeddings;
  served_ = ServedModel{.name = options_.served_model_name,
                        .tokenizer = tokenizer_.get(),
                        .format = &format_,
                        .max_model_len = context,
                        .vocab_size = config_.vocab_size,
                        .sampling_defaults = config_.sampling_defaults,
                        .reasoning_field = options_.reasoning_field,
                        .grammars = grammars_.get()};
  created_ = absl::ToUnixSeconds(absl::Now());
  // Names this build and model, as OpenAI's field does its backend config.
  system_fingerprint_ = absl::StrFormat(
      "fp_duet_%010x", std::hash<std::string>{}(absl::StrCat("duet/1 ", options_.served_model_name, " ",
                                                             tokenizer_->vocab_size(), " ", context)) &
                           0xffffffffffull);
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(dispatcher_, dispatch::NewDispatcher(options_.policy, {.cache = &cache_index_,
                                                                  .uncached_weight = options_.cache_aware_weights.uncached,
                                                                  .queued_weight = options_.cache_aware_weights.queued}));
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
  total_migrated_ = m.GetCounter("duet_request_migrations_total",
                                 "Requests moved off a lost decode worker (prefilled again, decoded elsewhere)");
  for (proto::Role role : {proto::ROLE_PREFILL, proto::ROLE_DECODE, proto::ROLE_COLOCATED}) {
    restarts_total_[std::string(RoleName(role))] = m.GetCounter(
        "duet_worker_restarts_total", "Workers that registered again from a new process",
        {{"role", std::string(RoleName(role))}});
  }

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
  tracked_workers_ = std::make_unique<RegistryWorkers>(registry_.get());
  {
    absl::MutexLock lock(&mu_);
    load_ = std::make_unique<LoadRecorder>(options_.clock->Now());
    tracker_ = std::make_unique<RequestTracker>(RequestTracker::Options{.max_attempts = options_.max_attempts,
                                                                        .max_migrations = options_.max_migrations,
                                                                        .config = config_,
                                                                        .first_attempt_id = first_attempt_id,
                                                                        .migrated_total = total_migrated_},
                                                dispatcher_.get(), tracked_workers_.get(), this);
  }
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
            << dispatch::DispatchPolicyName(options_.policy);
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
    tracker_->Clear();
    queries.swap(stats_queries_);
  }
  requests.clear();
  queries.clear();
  http_.reset();
  registry_.reset();
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
  f.String("policy", "least_loaded",
           "dispatch policy: least_loaded | round_robin | cache_aware (the prefill whose prefix cache holds most of "
           "the prompt, weighed against its queue)");
  f.String("cache-aware-weights", CacheAwareWeights{}.ToString(),
           "cache_aware: U,Q, a prefill's score = U x prompt tokens its cache lacks + Q x its queued prefill tokens");
  f.Int("heartbeat-ms", 500, "heartbeat interval workers are held to");
  f.Int("missed-heartbeats", 10, "heartbeats a worker may miss before it is dropped");
  f.Int("max-attempts", 3, "attempts per request across prefill failures");
  f.Int("max-migrations", 3,
        "times a request whose decode worker is lost moves on (prefilled again with the tokens it has, decoded "
        "elsewhere); 0: it ends with an error");
  f.Int("max-model-len", 0, "context in tokens (0: config.json's max_position_embeddings)");
  f.String("reasoning-field", "reasoning",
           "where a thinking model's <think> text goes in chat responses: reasoning (vLLM) | reasoning_content "
           "(DeepSeek's API, SGLang)");
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
  ASSIGN_OR_RETURN(o.policy, dispatch::ParseDispatchPolicy(f.GetString("policy")));
  RETURN_IF_ERROR(f.RefuseUnless(o.policy == dispatch::DispatchPolicy::kCacheAware, {"cache-aware-weights"},
                                 "unless --policy cache_aware"));
  ASSIGN_OR_RETURN(o.cache_aware_weights, ParseCacheAwareWeights(f.GetString("cache-aware-weights")));
  if (f.GetInt("heartbeat-ms") < 1) return absl::InvalidArgumentError("--heartbeat-ms must be >= 1");
  o.heartbeat_interval = absl::Milliseconds(f.GetInt("heartbeat-ms"));
  if (f.GetInt("missed-heartbeats") < 1) return absl::InvalidArgumentError("--missed-heartbeats must be >= 1");
  o.missed_heartbeats = static_cast<int>(f.GetInt("missed-heartbeats"));
  if (f.GetInt("max-attempts") < 1) return absl::InvalidArgumentError("--max-attempts must be >= 1");
  o.max_attempts = static_cast<int>(f.GetInt("max-attempts"));
  if (f.GetInt("max-migrations") < 0) return absl::InvalidArgumentError("--max-migrations must be >= 0");
  o.max_migrations = static_cast<int>(f.GetInt("max-migrations"));
  if (f.GetInt("max-model-len") < 0) return absl::InvalidArgumentError("--max-model-len must be >= 0");
  o.max_model_len = f.GetInt("max-model-len");
  o.reasoning_field = f.GetString("reasoning-field");
  if (o.reasoning_field != "reasoning" && o.reasoning_field != "reasoning_content") {
    return absl::InvalidArgumentError(
        absl::StrCat("--reasoning-field \"", o.reasoning_field, "\" is not one of reasoning, reasoning_content"));
  }
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

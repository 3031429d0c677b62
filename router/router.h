// The router process: OpenAI-compatible HTTP front door, worker registry,
// dispatch, and the per-request state machine that streams tokens back.
//
//   Router router;
//   RETURN_IF_ERROR(router.Start({.model_dir = dir, .http_listen = "0.0.0.0:8000"}));
//   ... workers register on router.control_address(); clients use http_port() ...
//   router.Stop();
//
// Request flow (proto/README.md): POST /v1/completions and
// /v1/chat/completions are validated and tokenized here. Each of the n
// choices is its own request to the workers (choice_index i, so one seed
// gives n different samples); the response ends when every choice has, and
// fails as a whole when one fails. A choice is dispatched as a
// PrefillRequest (one *attempt*, with a router-wide request_id) to a prefill worker naming the chosen decode.
// FirstToken comes from the prefill, TokenBatch and Finish from the decode;
// the router detokenizes incrementally and answers with one JSON body or an
// SSE stream. Each attempt moves dispatched -> first token -> decoding ->
// finished; events for ids the router no longer tracks are dropped.
// Failures: a lost prefill re-dispatches its attempts that have no first
// token yet; a decode's Finish{FINISH_ERROR, UNAVAILABLE} (KV pull failed)
// re-dispatches with resume_ids = every token the client already has; at
// most max_attempts attempts. A lost decode's requests migrate: each is
// prefilled again on a live prefill with its prompt plus the tokens the
// client already has, and decoded elsewhere (at most max_migrations times;
// past that it ends with an error, and its prefill side is cancelled). A client that disconnects gets its
// attempt cancelled on both workers. Every accepted request ends in a
// response or an error.
//
// Threads: one io thread for HTTP and the control plane (or one each, with
// io_threads = 2), plus the registry's connector. Router state lives under
// one mutex; HTTP replies and SSE events are queued per request under it and
// sent outside it, in order.
// Start and Stop are called from one thread; the getters are thread-safe.
#ifndef DUET_ROUTER_ROUTER_H_
#define DUET_ROUTER_ROUTER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/serving_defaults.h"
#include "base/clock.h"
#include "base/flags.h"
#include "http/server.h"
#include "dispatch/dispatch.h"

namespace duet::router {

struct RouterOptions {
  // A model directory: tokenizer.json (or GPT-2 files), tokenizer_config.json,
  // config.json. The router needs no weights.
  std::string model_dir;
  // The "model" clients send and workers must register with; default: the
  // model directory's base name.
  std::string served_model_name;
  std::string http_listen = "127.0.0.1:0";
  std::string control_listen = "127.0.0.1:0";
  dispatch::DispatchPolicy policy = dispatch::DispatchPolicy::kLeastLoaded;
  // cache_aware: the weights of a prompt's uncached tokens and of queued
  // prefill tokens in a prefill's score.
  CacheAwareWeights cache_aware_weights;
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // A worker silent for this many intervals is dropped. Generous, because a
  // loaded machine delays heartbeats; a dead process is noticed sooner, by
  // its closed connections.
  int missed_heartbeats = 10;
  int max_attempts = 3;
  // Moves of one request off lost decode workers (on top of max_attempts).
  int max_migrations = 3;
  absl::Duration stats_timeout = absl::Seconds(2);
  absl::Duration connect_timeout = absl::Seconds(2);
  // Context in tokens; 0: config.json's max_position_embeddings.
  int64_t max_model_len = 0;
  // The message field a thinking model's reasoning goes out in: "reasoning"
  // (vLLM's) or "reasoning_content" (DeepSeek's API, SGLang).
  std::string reasoning_field = "reasoning";
  Clock* clock = RealClock();  // Heartbeat deadlines and latency metrics.
  // Non-empty: the OpenAI endpoints (/v1/...) require "Authorization: Bearer
  // <api_key>" (401 otherwise); /health and /metrics stay open.
  std::string api_key;
  // Client requests in flight at once; more are refused with 429 and
  // Retry-After (workers queue what they hold, the router bounds the rest).
  int64_t max_requests = 4096;
  // Body, header and connection limits and the timeouts that bound slow clients.
  http::HttpLimits http_limits;
  // Network threads: 1 runs HTTP and the control plane on one thread (no
  // hand-off per token: the lowest latency, and a one-core router's best);
  // 2 gives each its own.
  int io_threads = 1;
};

class Router {
 public:
  Router();
  ~Router();  // Stops.
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Loads the tokenizer, listens on both ports. Errors name the file or
  // address at fault.
  absl::Status Start(RouterOptions options);
  // Closes client connections (their requests are cancelled on the workers),
  // then worker connections. Idempotent.
  void Stop();

  int http_port() const;
  std::string control_address() const;  // HOST:PORT workers register on.
  const std::string& served_model_name() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The `duet router` flags, declared once so the command and its help agree.
void AddRouterFlags(FlagSet& flags);
absl::StatusOr<RouterOptions> RouterOptionsFromFlags(const FlagSet& flags);

}  // namespace duet::router

#endif  // DUET_ROUTER_ROUTER_H_

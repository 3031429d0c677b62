// A small HTTP/1.1 server on Boost.Beast: the front door of the router (OpenAI
// API, /stats, /health) and the /metrics endpoint of every process.
//
//   auto server = HttpServer::Start(io, "0.0.0.0:8000", [](HttpRequest req, HttpExchangePtr ex) {
//     ex->Reply({.status = 200, .body = R"({"ok": true})"}); }, HttpLimits{});
//
// Routing belongs to the handler (it looks at method and path). The handler
// runs on the io_context (calls for one connection never overlap) and must not
// block: it answers through the HttpExchange, at once or later from any
// thread, with one Reply or one SSE stream (StartStream, SendEvent...,
// EndStream). While a request is unanswered or streaming, the server keeps a
// read pending on the socket, so a client that disconnects is noticed at once:
// client_gone() turns true and the OnClientGone callback fires once. This is
// how the router cancels generation on disconnect.
//
// Bad input never crashes the process: an oversized body gets 413, oversized
// headers 431, malformed HTTP 400 (all with an OpenAI-shaped JSON error body,
// then close), connections over the limit get 503, and clients too slow to
// send their headers (slowloris) or body, idle too long between keep-alive
// requests, or not reading their response are disconnected. Rejections are
// logged, rate-limited, and counted in duet_http_requests_total{code}.
//
// Ownership: the caller owns the HttpServer and the io_context; the io_context
// must outlive the server and every HttpExchange the handler keeps. All
// HttpExchange methods are thread-safe; HttpServer methods are too.
#ifndef DUET_HTTP_SERVER_H_
#define DUET_HTTP_SERVER_H_

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The path of a request target: origin-form "/p?q" or absolute-form
// "http://host:port/p?q" -> "/p" (an absolute target with no path: "/").
std::string TargetPath(absl::string_view target);
// %XX escapes decoded (a malformed one is kept as is); '+' stays '+'.
std::string PercentDecode(absl::string_view s);
// The first value of `name` in the target's query ("/p?a=1&b=2", "b" -> "2"),
// percent-decoded; nullopt when absent.
std::optional<std::string> QueryParam(absl::string_view target, absl::string_view name);

struct HttpRequest {
  std::string method;                          // As sent: "GET", "POST", ...
  std::string target;                          // As sent: "/v1/models?x=1", or absolute-form
                                               // "http://host:8000/v1/models?x=1" (RFC 9112 3.2.2).
  std::string path;                            // The target's path: "/v1/models" for both.
  std::map<std::string, std::string> headers;  // Lower-case names; repeats joined by ", ".
  std::string body;
  std::string peer;  // "IP:PORT" of the client.
};

struct HttpResponse {
  int status = 200;
  HeaderList headers;  // Content-Length, Transfer-Encoding and Connection are the server's.
  std::string body;
  std::string content_type = "application/json";
};

struct HttpLimits {
  size_t max_body_bytes = 4u << 20;
  size_t max_header_bytes = 16u << 10;
  int max_connections = 1024;
  // From accept (or, on a keep-alive connection, from the request's first
  // byte) to the end of the headers: bounds slowloris clients.
  absl::Duration header_timeout = absl::Seconds(10);
  // Keep-alive connections with no request started for this long are closed.
  absl::Duration idle_timeout = absl::Seconds(60);
  // From the end of the headers to the end of the body.
  absl::Duration body_timeout = absl::Seconds(30);
  // One write that cannot finish this long (a client that stopped reading)
  // closes the connection, which counts as the client gone.
  absl::Duration write_timeout = absl::Seconds(30);
};

// The error body OpenAI's API returns, which every OpenAI SDK parses:
// {"error": {"message": ..., "type": ..., "param": null, "code": null}}.
std::string OpenAiErrorJson(std::string_view message, std::string_view type = "invalid_request_error");

namespace internal {
class Session;
}  // namespace internal

// One request's answer channel. Exactly one of Reply or a stream; calls out of
// that order are logged and ignored, and every call once the client is gone
// is a no-op. Dropping the last reference without answering sends 500;
// dropping it mid-stream closes the connection (the client sees a truncated
// stream, not a clean end).
class HttpExchange {
 public:
  // Made by the server only.
  explicit HttpExchange(std::shared_ptr<internal::Session> session);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  void Reply(HttpResponse response);

  // Server-sent events: status line and headers with Content-Type
  // text/event-stream and chunked transfer encoding.
  void StartStream(int status = 200, HeaderList headers = {});
  // Sends "data: <data>\n\n" (one "data: " line per line of `data`) as one chunk.
  void SendEvent(std::string_view data);
  // Ends the chunked body; the connection is then ready for the next request.
  void EndStream();

  bool client_gone() const { return gone_.load(); }
  // `fn` runs once when the client disconnects (or a write to it fails, or the
  // server stops) before the response is complete, on the io thread; it must
  // not block. If the client is already gone, `fn` runs now, on this thread.
  void OnClientGone(std::function<void()> fn);

 private:
  friend class internal::Session;
  enum class State { kNew, kReplied, kStreaming, kEnded };
  void MarkGone();  // From the session, on its strand.
  // Whether `call` may go on now: the client is not gone and the exchange
  // is in state `from` (else it logs `call` as ignored); it then moves to `to`.
  bool Advance(State from, State to, const char* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<internal::Session> session_;
  std::atomic<bool> gone_{false};
  absl::Mutex mu_;
  // The mutex also orders the posts to the session, so bytes go out in call order.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  std::function<void()> on_gone_ ABSL_GUARDED_BY(mu_);
};

using HttpExchangePtr = std::shared_ptr<HttpExchange>;

// A metrics port's handler: GET /metrics (the default registry's text),
// /health ({"status":"ok"}), 404 for anything else. Workers and the planner
// serve it.
void ServeMetricsAndHealth(HttpRequest req, HttpExchangePtr ex);
using HttpHandler = std::function<void(HttpRequest, HttpExchangePtr)>;

namespace internal {
struct ServerState;
}  // namespace internal

class HttpServer {
 public:
  // Listens on HOST:PORT (port 0 picks one; HOST may be an IPv4 address,
  // [IPv6], "localhost" or empty for all interfaces) and serves until Stop.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(boost::asio::io_context& io,
                                                           const std::string& address, HttpHandler handler,
                                                           HttpLimits limits = {});
  ~HttpServer();  // Stops.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return port_; }
  // Connections admitted and not yet closing (at most max_connections).
  int connections() const;
  // Stops accepting and closes every connection (unanswered exchanges see
  // their client gone). Idempotent; returns without waiting.
  void Stop();

 private:
  explicit HttpServer(std::shared_ptr<internal::ServerState> state) : state_(std::move(state)) {}

  std::shared_ptr<internal::ServerState> state_;
  uint16_t port_ = 0;
};

}  // namespace duet::http

#endif  // DUET_HTTP_SERVER_H_

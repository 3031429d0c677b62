#include "http/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/metrics.h"
#include "base/io_thread.h"

namespace duet::http {
namespace {

// A blocking HTTP/1.1 client on a plain socket, so the tests see exactly the
// bytes the server sends. Reads give up after 10 s so a broken server fails a
// test instead of hanging it.
class RawClient {
 public:
  struct Response {
    int status = 0;
    std::map<std::string, std::string> headers;  // Lower-case names.
    std::string body;                            // De-chunked.
  };

  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawClient() { Close(); }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

  // False once the server has closed (EPIPE / ECONNRESET).
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Status line and headers.
  std::optional<Response> ReadHead() {
    auto line = ReadLine();
    if (!line || line->size() < 12 || line->compare(0, 5, "HTTP/") != 0) return std::nullopt;
    Response r;
    if (!absl::SimpleAtoi(line->substr(9, 3), &r.status)) return std::nullopt;
    while (true) {
      line = ReadLine();
      if (!line) return std::nullopt;
      if (line->empty()) break;
      size_t colon = line->find(':');
      if (colon == std::string::npos) return std::nullopt;
      std::string value = line->substr(colon + 1);
      r.headers[absl::AsciiStrToLower(line->substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(value));
    }
    return r;
  }

  // The next chunk's data; "" for the last chunk (its trailer is consumed).
  std::optional<std::string> ReadChunk() {
    auto line = ReadLine();
    if (!line) return std::nullopt;
    size_t size = 0;
    if (!absl::SimpleHexAtoi(line->substr(0, line->find(';')), &size)) return std::nullopt;
    if (size == 0) {
      auto end = ReadLine();  // No trailers from our server: just the blank line.
      if (!end || !end->empty()) return std::nullopt;
      return std::string();
    }
    auto data = ReadN(size);
    auto crlf = ReadLine();
    if (!data || !crlf || !crlf->empty()) return std::nullopt;
    return data;
  }

  std::optional<Response> ReadResponse() {
    auto r = ReadHead();
    if (!r) return std::nullopt;
    if (r->headers.count("content-length")) {
      size_t n;
      if (!absl::SimpleAtoi(r->headers["content-length"], &n)) return std::nullopt;
      auto body = ReadN(n);
      if (!body) return std::nullopt;
      r->body = *body;
    } else if (r->headers["transfer-encoding"] == "chunked") {
      while (true) {
        auto chunk = ReadChunk();
        if (!chunk) return std::nullopt;
        if (chunk->empty()) break;
        r->body += *chunk;
      }
    }
    return r;
  }

  std::optional<Response> RoundTrip(const std::string& request) {
    if (!Send(request)) return std::nullopt;
    return ReadResponse();
  }

  // True when the server closes the connection (EOF or reset) with no
  // further bytes; false if bytes arrive or nothing happens within 10 s.
  bool WaitClosedByServer() {
    if (!buf_.empty()) return false;
    char c;
    ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  bool Fill() {
    char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  std::optional<std::string> ReadLine() {
    size_t pos;
    while ((pos = buf_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    std::string line = buf_.substr(0, pos);
    buf_.erase(0, pos + 2);
    return line;
  }
  std::optional<std::string> ReadN(size_t n) {
    while (buf_.size() < n) {
      if (!Fill()) return std::nullopt;
    }
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  std::string buf_;
};

std::string Get(const std::string& target, const std::string& extra_headers = "") {
  return absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: test\r\n", extra_headers, "\r\n");
}

std::string Post(const std::string& target, const std::string& body, const std::string& extra_headers = "") {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: test\r\nContent-Length: ", body.size(), "\r\n",
                      extra_headers, "\r\n", body);
}

// Joins the threads handlers start, before the server and io thread go away.
struct Threads {
  ~Threads() {
    std::lock_guard<std::mutex> l(mu);
    for (auto& t : threads) t.join();
  }
  void Spawn(std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu);
    threads.emplace_back(std::move(fn));
  }
  void JoinAll() {
    std::lock_guard<std::mutex> l(mu);
    for (auto& t : threads) t.join();
    threads.clear();
  }
  std::mutex mu;
  std::vector<std::thread> threads;
};

// Checks an OpenAI-shaped error body.
void RequireOpenAiError(const std::string& body, const std::string& type, const std::string& message_part) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  REQUIRE(j.is_object());
  REQUIRE(j.size() == 1);
  const auto& e = j.at("error");
  REQUIRE(e.at("type") == type);
  REQUIRE(e.at("param").is_null());
  REQUIRE(e.at("code").is_null());
  REQUIRE(e.at("message").get<std::string>().find(message_part) != std::string::npos);
}

double ResponsesWithCode(int code) {
  return MetricsRegistry::Default()
      .GetCounter("duet_http_requests_total", "HTTP responses sent, by status code",
                  {{"code", std::to_string(code)}})
      ->Value();
}

int StatusOf(const std::optional<RawClient::Response>& r) { return r ? r->status : -1; }

std::unique_ptr<HttpServer> StartServer(IoThread& io, HttpHandler handler, HttpLimits limits = {}) {
  auto s = HttpServer::Start(io.context(), "127.0.0.1:0", std::move(handler), limits);
  REQUIRE(s.ok());
  REQUIRE((*s)->port() != 0);
  return std::move(*s);
}

// Answers every request with a JSON echo of what the server parsed.
HttpHandler EchoHandler(std::atomic<int>* calls = nullptr) {
  return [calls](HttpRequest req, HttpExchangePtr ex) {
    if (calls) ++*calls;
    nlohmann::json j = {{"method", req.method}, {"target", req.target}, {"path", req.path},
                        {"body", req.body},     {"peer", req.peer},     {"headers", req.headers}};
    ex->Reply({.status = 200, .body = j.dump()});
  };
}

TEST_CASE("GET and POST round-trip on one keep-alive connection", "[http]") {
  IoThread io;
  Threads threads;
  auto server = StartServer(io, [&](HttpRequest req, HttpExchangePtr ex) {
    nlohmann::json j = {{"method", req.method}, {"target", req.target}, {"path", req.path},
                        {"body", req.body},     {"peer", req.peer},     {"headers", req.headers}};
    if (req.method == "GET") {
      ex->Reply({.status = 200, .body = j.dump()});
      return;
    }
    // Replies later, from another thread, as the router does.
    threads.Spawn([ex, body = j.dump()] {
      ex->Reply(
          {.status = 201, .headers = {{"X-Custom", "yes"}}, .body = body, .content_type = "text/plain"});
    });
  });
  const double ok_before = ResponsesWithCode(200);

  RawClient c(server->port());
  auto r1 = c.RoundTrip(Get("/v1/models?limit=2", "X-Test: One\r\nX-Test: Two\r\n"));
  REQUIRE(r1);
  REQUIRE(r1->status == 200);
  REQUIRE(r1->headers["content-type"] == "application/json");
  REQUIRE(r1->headers["connection"] == "keep-alive");
  auto j1 = nlohmann::json::parse(r1->body);
  REQUIRE(j1["method"] == "GET");
  REQUIRE(j1["target"] == "/v1/models?limit=2");
  REQUIRE(j1["path"] == "/v1/models");
  REQUIRE(j1["headers"]["x-test"] == "One, Two");
  REQUIRE(j1["headers"]["host"] == "test");
  REQUIRE(j1["body"] == "");
  REQUIRE(j1["peer"].get<std::string>().rfind("127.0.0.1:", 0) == 0);

  // The same socket carries a second request.
  const std::string payload = R"({"model": "tiny", "prompt": "hi"})";
  auto r2 = c.RoundTrip(Post("/v1/completions", payload, "Content-Type: application/json\r\n"));
  REQUIRE(r2);
  REQUIRE(r2->status == 201);
  REQUIRE(r2->headers["x-custom"] == "yes");
  REQUIRE(r2->headers["content-type"] == "text/plain");
  REQUIRE(r2->headers["content-length"] == std::to_string(r2->body.size()));
  auto j2 = nlohmann::json::parse(r2->body);
  REQUIRE(j2["method"] == "POST");
  REQUIRE(j2["path"] == "/v1/completions");
  REQUIRE(j2["body"] == payload);
  REQUIRE(j2["peer"] == j1["peer"]);  // Same connection.
  REQUIRE(server->connections() == 1);
  REQUIRE(ResponsesWithCode(200) - ok_before == 1);
}

TEST_CASE("an oversized body gets 413 with an OpenAI error, and the handler never runs", "[http]") {
  IoThread io;
  std::atomic<int> calls{0};
  auto server = StartServer(io, EchoHandler(&calls), {.max_body_bytes = 1024});

  SECTION("at the limit is fine") {
    RawClient c(server->port());
    auto r = c.RoundTrip(Post("/", std::string(1024, 'a')));
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(calls == 1);
  }
  SECTION("Content-Length over the limit") {
    RawClient c(server->port());
    c.Send(Post("/v1/chat/completions", std::string(4096, 'a')));
    auto r = c.ReadResponse();
    REQUIRE(r);
    REQUIRE(r->status == 413);
    REQUIRE(r->headers["content-type"] == "application/json");
    REQUIRE(r->headers["connection"] == "close");
    RequireOpenAiError(r->body, "invalid_request_error", "exceeds the limit of 1024 bytes");
    REQUIRE(c.WaitClosedByServer());
    REQUIRE(calls == 0);
  }
  SECTION("a chunked body that grows over the limit") {
    RawClient c(server->port());
    std::string chunk(600, 'b');
    c.Send("POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; ++i) c.Send(absl::StrCat("258\r\n", chunk, "\r\n"));  // 0x258 = 600.
    c.Send("0\r\n\r\n");
    auto r = c.ReadResponse();
    REQUIRE(r);
    REQUIRE(r->status == 413);
    RequireOpenAiError(r->body, "invalid_request_error", "exceeds the limit");
    REQUIRE(c.WaitClosedByServer());
    REQUIRE(calls == 0);
  }
}

TEST_CASE("huge headers get 431", "[http]") {
  IoThread io;
  std::atomic<int> calls{0};
  auto server = StartServer(io, EchoHandler(&calls), {.max_header_bytes = 1024});
  RawClient c(server->port());
  auto r = c.RoundTrip(Get("/", absl::StrCat("X-Big: ", std::string(8000, 'x'), "\r\n")));
  REQUIRE(r);
  REQUIRE(r->status == 431);
  RequireOpenAiError(r->body, "invalid_request_error", "headers exceed the limit of 1024 bytes");
  REQUIRE(c.WaitClosedByServer());
  REQUIRE(calls == 0);

  // Headers under the limit still pass.
  RawClient ok(server->port());
  auto r2 = ok.RoundTrip(Get("/", absl::StrCat("X-Big: ", std::string(500, 'x'), "\r\n")));
  REQUIRE(r2);
  REQUIRE(r2->status == 200);
}

TEST_CASE("malformed requests get 400 and close; the server keeps serving", "[http]") {
  IoThread io;
  std::atomic<int> calls{0};
  auto server = StartServer(io, EchoHandler(&calls));
  const double bad_before = ResponsesWithCode(400);
  for (std::string garbage : {std::string("THIS IS NOT HTTP\r\n\r\n"), std::string("GET / HTTP/9.9x\r\n\r\n"),
                              std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 15),
                              std::string("POST / HTTP/1.1\r\nContent-Length: nope\r\n\r\n")}) {
    RawClient c(server->port());
    c.Send(garbage);
    auto r = c.ReadResponse();
    REQUIRE(r);
    REQUIRE(r->status == 400);
    RequireOpenAiError(r->body, "invalid_request_error", "malformed HTTP request");
    REQUIRE(c.WaitClosedByServer());
  }
  REQUIRE(ResponsesWithCode(400) - bad_before == 4);
  REQUIRE(calls == 0);
  RawClient good(server->port());
  auto r = good.RoundTrip(Get("/health"));
  REQUIRE(r);
  REQUIRE(r->status == 200);
}

TEST_CASE("an SSE stream reaches the client event by event", "[http]") {
  IoThread io;
  Threads threads;
  // The client acknowledges each event before the next is sent, so each must
  // arrive on its own rather than at the end of the stream.
  absl::Notification acked[3];
  auto server = StartServer(io, [&](HttpRequest req, HttpExchangePtr ex) {
    if (req.path != "/stream") return ex->Reply({.body = "{}"});
    ex->StartStream(200, {{"X-Request-Id", "abc"}});
    threads.Spawn([ex, &acked] {
      const std::string events[3] = {R"({"i":1})", R"({"i":2})", "two\nlines"};
      for (int i = 0; i < 3; ++i) {
        ex->SendEvent(events[i]);
        if (!acked[i].WaitForNotificationWithTimeout(absl::Seconds(10))) return;
      }
      ex->SendEvent("[DONE]");
      ex->EndStream();
    });
  });

  RawClient c(server->port());
  REQUIRE(c.Send(Post("/stream", R"({"stream": true})")));
  auto head = c.ReadHead();
  REQUIRE(head);
  REQUIRE(head->status == 200);
  REQUIRE(head->headers["content-type"] == "text/event-stream");
  REQUIRE(head->headers["transfer-encoding"] == "chunked");
  REQUIRE(head->headers["cache-control"] == "no-cache");
  REQUIRE(head->headers["x-request-id"] == "abc");
  REQUIRE(head->headers.count("content-length") == 0);

  const std::string expected[3] = {"data: {\"i\":1}\n\n", "data: {\"i\":2}\n\n",
                                   "data: two\ndata: lines\n\n"};
  std::string all;
  for (int i = 0; i < 3; ++i) {
    auto chunk = c.ReadChunk();
    REQUIRE(chunk);
    REQUIRE(*chunk == expected[i]);
    all += *chunk;
    acked[i].Notify();
  }
  auto done = c.ReadChunk();
  REQUIRE(done);
  REQUIRE(*done == "data: [DONE]\n\n");
  all += *done;
  auto last = c.ReadChunk();
  REQUIRE(last);
  REQUIRE(last->empty());
  REQUIRE(all == "data: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: two\ndata: lines\n\ndata: [DONE]\n\n");

  // The connection is reusable once the stream has ended.
  auto next = c.RoundTrip(Get("/after"));
  REQUIRE(next);
  REQUIRE(next->status == 200);
  REQUIRE(next->body == "{}");
}

TEST_CASE("a client that leaves mid-stream fires OnClientGone exactly once", "[http]") {
  IoThread io;
  Threads threads;
  std::atomic<int> gone_calls{0};
  std::atomic<int> late_callback_calls{0};
  absl::Notification gone;
  absl::Notification sender_done;
  auto server = StartServer(io, [&](HttpRequest, HttpExchangePtr ex) {
    ex->OnClientGone([&] {
      ++gone_calls;
      gone.Notify();
    });
    ex->StartStream();
    threads.Spawn([ex, &gone, &late_callback_calls, &sender_done] {
      // Streams until it sees the client gone, as a router generation loop does.
      int sent = 0;
      while (!ex->client_gone()) {
        ex->SendEvent(absl::StrCat("tick ", sent++));
        gone.WaitForNotificationWithTimeout(absl::Milliseconds(5));
      }
      // All no-ops now.
      ex->SendEvent("late");
      ex->EndStream();
      ex->Reply({.body = "{}"});
      // Registered after the fact: runs at once, here.
      ex->OnClientGone([&] { ++late_callback_calls; });
      sender_done.Notify();
    });
  });

  {
    RawClient c(server->port());
    REQUIRE(c.Send(Post("/v1/completions", "{}")));
    auto head = c.ReadHead();
    REQUIRE(head);
    REQUIRE(head->status == 200);
    auto first = c.ReadChunk();
    REQUIRE(first);
    REQUIRE(*first == "data: tick 0\n\n");
  }  // Disconnects.
  REQUIRE(sender_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  threads.JoinAll();
  REQUIRE(gone_calls == 1);
  REQUIRE(late_callback_calls == 1);
  REQUIRE(server->connections() == 0);
}

// A server whose handler answers nothing (a long request): it keeps the
// exchange and notes when its client is gone.
struct HoldingServer {
  explicit HoldingServer(IoThread& io)
      : server(StartServer(io, [this](HttpRequest, HttpExchangePtr ex) {
          ex->OnClientGone([this] { gone.Notify(); });
          std::lock_guard<std::mutex> l(mu);
          held = ex;
          handled.Notify();
        })) {}

  std::mutex mu;
  HttpExchangePtr held;
  absl::Notification handled, gone;
  std::unique_ptr<HttpServer> server;
};

TEST_CASE("a client that leaves while its request waits is noticed without writing", "[http]") {
  IoThread io;
  HoldingServer hs(io);
  {
    RawClient c(hs.server->port());
    REQUIRE(c.Send(Post("/v1/completions", "{}")));
    REQUIRE(hs.handled.WaitForNotificationWithTimeout(absl::Seconds(10)));
    REQUIRE_FALSE(hs.held->client_gone());
  }
  REQUIRE(hs.gone.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::lock_guard<std::mutex> l(hs.mu);
  REQUIRE(hs.held->client_gone());
  hs.held->Reply({.body = "{}"});  // No-op, no crash.
  hs.held.reset();
}

TEST_CASE("Stop closes connections and unanswered exchanges see their client gone", "[http]") {
  IoThread io;
  HoldingServer hs(io);
  RawClient c(hs.server->port());
  REQUIRE(c.Send(Get("/")));
  REQUIRE(hs.handled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  hs.server->Stop();
  REQUIRE(hs.gone.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE(c.WaitClosedByServer());
  std::lock_guard<std::mutex> l(hs.mu);
  hs.held.reset();
}

TEST_CASE("a handler that drops the exchange unanswered yields 500", "[http]") {
  IoThread io;
  auto server = StartServer(io, [](HttpRequest, HttpExchangePtr) {});
  RawClient c(server->port());
  auto r = c.RoundTrip(Get("/"));
  REQUIRE(r);
  REQUIRE(r->status == 500);
  RequireOpenAiError(r->body, "server_error", "dropped");
  // The connection stays usable.
  auto r2 = c.RoundTrip(Get("/"));
  REQUIRE(r2);
  REQUIRE(r2->status == 500);
}

TEST_CASE("a slowloris client is cut off by the header timeout while others are served", "[http]") {
  IoThread io;
  auto server = StartServer(io, EchoHandler(), {.header_timeout = absl::Milliseconds(300)});
  const auto start = std::chrono::steady_clock::now();
  RawClient slow(server->port());
  // Headers that never end, one byte per 50 ms: each byte would reset a
  // per-read timeout, so only a deadline on the whole header stops this.
  const std::string endless = "GET / HTTP/1.1\r\nX-Slow: " + std::string(1000, 'a');
  bool cut_off = false;
  size_t sent = 0;
  for (; sent < 200 && !cut_off; ++sent) {
    if (!slow.Send(endless.substr(sent, 1))) {
      cut_off = true;
      break;
    }
    if (sent == 2) {
      // Meanwhile a normal client is served.
      RawClient normal(server->port());
      auto r = normal.RoundTrip(Get("/fine"));
      REQUIRE(r);
      REQUIRE(r->status == 200);
    }
    // Paces the slow client; returns early when the server closes it.
    pollfd p{.fd = slow.fd(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 50) > 0) cut_off = slow.WaitClosedByServer();
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(cut_off);
  REQUIRE(elapsed_s >= 0.3);
  REQUIRE(elapsed_s < 5.0);
  REQUIRE(sent < 100);
}

TEST_CASE("an idle keep-alive connection is closed after idle_timeout", "[http]") {
  IoThread io;
  auto server = StartServer(io, EchoHandler(), {.idle_timeout = absl::Milliseconds(200)});
  RawClient c(server->port());
  auto r = c.RoundTrip(Get("/"));
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(c.WaitClosedByServer());
  REQUIRE(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(150));
}

TEST_CASE("max_connections is enforced with 503, and a freed slot is reused", "[http]") {
  IoThread io;
  auto server = StartServer(io, EchoHandler(), {.max_connections = 2});
  RawClient c1(server->port()), c2(server->port());
  REQUIRE(StatusOf(c1.RoundTrip(Get("/"))) == 200);
  REQUIRE(StatusOf(c2.RoundTrip(Get("/"))) == 200);
  REQUIRE(server->connections() == 2);

  RawClient c3(server->port());
  c3.Send(Get("/"));
  auto r3 = c3.ReadResponse();
  REQUIRE(r3);
  REQUIRE(r3->status == 503);
  RequireOpenAiError(r3->body, "server_error", "too many open connections");
  REQUIRE(c3.WaitClosedByServer());
  REQUIRE(server->connections() == 2);

  // c1 says goodbye; its slot is free by the time it sees the close.
  auto bye = c1.RoundTrip(Get("/", "Connection: close\r\n"));
  REQUIRE(bye);
  REQUIRE(bye->headers["connection"] == "close");
  REQUIRE(c1.WaitClosedByServer());
  RawClient c4(server->port());
  auto r4 = c4.RoundTrip(Get("/"));
  REQUIRE(r4);
  REQUIRE(r4->status == 200);
  REQUIRE(StatusOf(c2.RoundTrip(Get("/"))) == 200);
}

TEST_CASE("Expect: 100-continue, HEAD and HTTP/1.0", "[http]") {
  IoThread io;
  auto server = StartServer(io, EchoHandler());
  SECTION("100-continue comes before the body is read") {
    RawClient c(server->port());
    c.Send("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    auto cont = c.ReadHead();
    REQUIRE(cont);
    REQUIRE(cont->status == 100);
    c.Send("hello");
    auto r = c.ReadResponse();
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(nlohmann::json::parse(r->body)["body"] == "hello");
  }
  SECTION("HEAD has a length but no body") {
    RawClient c(server->port());
    c.Send("HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n");
    auto r = c.ReadHead();
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(std::stoi(r->headers["content-length"]) > 0);
    // The next response follows at once: no body bytes in between.
    auto r2 = c.RoundTrip(Get("/y"));
    REQUIRE(r2);
    REQUIRE(nlohmann::json::parse(r2->body)["path"] == "/y");
  }
  SECTION("HTTP/1.0 without keep-alive is closed after the response") {
    RawClient c(server->port());
    c.Send("GET /old HTTP/1.0\r\n\r\n");
    auto r = c.ReadResponse();
    REQUIRE(r);
    REQUIRE(r->status == 200);
    REQUIRE(r->headers["connection"] == "close");
    REQUIRE(c.WaitClosedByServer());
  }
}

TEST_CASE("a target's path: origin-form and absolute-form (RFC 9112); percent-decoding", "[http]") {
  CHECK(TargetPath("/v1/models?x=1") == "/v1/models");
  CHECK(TargetPath("http://host:8000/v1/models?x=1") == "/v1/models");
  CHECK(TargetPath("https://host") == "/");
  CHECK(TargetPath("/a/http://b") == "/a/http://b");  // origin-form, whatever it contains
  CHECK(PercentDecode("org%2Fname%20x") == "org/name x");
  CHECK(PercentDecode("a%2") == "a%2");
  CHECK(PercentDecode("%zz+") == "%zz+");
  CHECK(QueryParam("/figures?window_s=30&x=%32", "x") == "2");
  CHECK(QueryParam("/figures?window_s=30&x=2", "window_s") == "30");
  CHECK(QueryParam("/figures?flag&x=2", "flag") == "");
  CHECK(QueryParam("/figures?xwindow_s=3", "window_s") == std::nullopt);
  CHECK(QueryParam("/figures#window_s=3", "window_s") == std::nullopt);
  CHECK(QueryParam("/figures", "window_s") == std::nullopt);
  // Over a socket: the handler sees the path of an absolute target.
  IoThread io;
  auto server = StartServer(io, EchoHandler());
  RawClient c(server->port());
  c.Send(absl::StrCat("GET http://127.0.0.1:", server->port(), "/abs?q=2 HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.ReadResponse();
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(nlohmann::json::parse(r->body)["path"] == "/abs");
}

TEST_CASE("OpenAiErrorJson has OpenAI's shape and survives bad UTF-8", "[http]") {
  RequireOpenAiError(OpenAiErrorJson("bad \"model\"\n"), "invalid_request_error", "bad \"model\"\n");
  RequireOpenAiError(OpenAiErrorJson("x", "server_error"), "server_error", "x");
  auto j = nlohmann::json::parse(OpenAiErrorJson(std::string("caf\xc3", 4)));
  REQUIRE(j["error"]["message"].get<std::string>().rfind("caf", 0) == 0);
}

TEST_CASE("Start rejects bad addresses", "[http]") {
  IoThread io;
  REQUIRE(HttpServer::Start(io.context(), "nope", EchoHandler()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(HttpServer::Start(io.context(), "127.0.0.1:99999", EchoHandler()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  auto a = HttpServer::Start(io.context(), "127.0.0.1:0", EchoHandler());
  REQUIRE(a.ok());
  auto b = HttpServer::Start(io.context(), absl::StrCat("127.0.0.1:", (*a)->port()), EchoHandler());
  REQUIRE(b.status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace duet::http

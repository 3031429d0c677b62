#include "http/server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/listen.h"
#include "base/metrics.h"
#include "base/status_macros.h"

namespace duet::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;

namespace {

// How long a connection we are closing keeps reading (and discarding) what
// the client still sends. Closing with unread bytes makes the kernel send a
// reset, which can destroy our error response before the client reads it.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr size_t kReadChunk = 4096;
// Rejection log lines per second, per server; the rest are counted and summarised.
constexpr int kMaxLogLinesPerSecond = 5;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(absl::ToChronoNanoseconds(d));
}

// Beast's string_view is Boost's and Debian's absl has its own: convert
// explicitly between the three.
template <class S>
absl::string_view View(const S& s) {
  return absl::string_view(s.data(), s.size());
}

std::string ReasonPhrase(int status) {
  auto s = bhttp::int_to_status(static_cast<unsigned>(status));
  if (s == bhttp::status::unknown) return "Unknown";
  return std::string(View(bhttp::obsolete_reason(s)));
}

void CountResponse(int status) {
  MetricsRegistry::Default()
      .GetCounter("duet_http_requests_total", "HTTP responses sent, by status code",
                  {{"code", std::to_string(status)}})
      ->Increment();
}

// Header names and values must not let a handler smuggle in a second header
// or a second response.
bool SafeHeader(const std::string& name, const std::string& value) {
  if (name.empty()) return false;
  for (char c : name) {
    if (c <= ' ' || c == ':' || c == 127) return false;
  }
  for (char c : value) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return !absl::EqualsIgnoreCase(name, "content-length") &&
         !absl::EqualsIgnoreCase(name, "transfer-encoding") && !absl::EqualsIgnoreCase(name, "connection");
}

std::string EncodeEvent(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  for (absl::string_view line : absl::StrSplit(View(data), '\n')) absl::StrAppend(&out, "data: ", line, "\n");
  out += "\n";
  return out;
}

}  // namespace

std::string TargetPath(absl::string_view target) {
  if (const size_t scheme = target.find("://");
      scheme != absl::string_view::npos && target.substr(0, 1) != "/") {
    const size_t slash = target.find('/', scheme + 3);
    target = slash == absl::string_view::npos ? absl::string_view("/") : target.substr(slash);
  }
  return std::string(target.substr(0, target.find('?')));
}

std::string PercentDecode(absl::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

void ServeMetricsAndHealth(HttpRequest req, HttpExchangePtr ex) {
  HttpResponse resp;
  if (req.path == "/metrics") {
    resp.content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp.body = MetricsRegistry::Default().RenderText();
  } else if (req.path == "/health") {
    resp.body = "{\"status\":\"ok\"}";
  } else {
    resp.status = 404;
    resp.body = OpenAiErrorJson("not found: " + req.path, "not_found_error");
  }
  ex->Reply(std::move(resp));
}

std::optional<std::string> QueryParam(absl::string_view target, absl::string_view name) {
  const size_t q = target.find('?');
  if (q == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = target.substr(q + 1);
  rest = rest.substr(0, rest.find('#'));
  for (absl::string_view pair : absl::StrSplit(rest, '&')) {
    const size_t eq = pair.find('=');
    if (PercentDecode(pair.substr(0, eq)) != name) continue;
    return eq == absl::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

std::string OpenAiErrorJson(std::string_view message, std::string_view type) {
  nlohmann::json j = {{"error",
                       {{"message", std::string(message)},
                        {"type", std::string(type)},
                        {"param", nullptr},
                        {"code", nullptr}}}};
  // Replace invalid UTF-8 rather than throw: messages may quote client input.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace internal {

// Shared by the server and its sessions, so a session that outlives the
// HttpServer object still has its handler and limits.
struct ServerState {
  ServerState(asio::io_context& io, HttpHandler h, HttpLimits l)
      : acceptor(asio::make_strand(io)),
        retry_timer(acceptor.get_executor()),
        handler(std::move(h)),
        limits(l) {}

  // One warning line, unless this server already logged kMaxLogLinesPerSecond
  // this second (a flood of bad clients must not flood the log).
  void LogRejection(const std::string& peer, absl::string_view what) {
    int64_t suppressed = 0;
    {
      absl::MutexLock l(&log_mu);
      absl::Time now = absl::Now();
      if (now - log_window_start >= absl::Seconds(1)) {
        suppressed = log_suppressed;
        log_window_start = now;
        log_lines = 0;
        log_suppressed = 0;
      }
      if (log_lines >= kMaxLogLinesPerSecond) {
        ++log_suppressed;
        return;
      }
      ++log_lines;
    }
    LOG(WARNING) << "http: " << peer << ": " << what
                 << (suppressed > 0 ? absl::StrCat(" (", suppressed, " similar lines suppressed)") : "");
  }

  tcp::acceptor acceptor;          // Used on its strand only.
  asio::steady_timer retry_timer;  // Backs off accept errors such as EMFILE.
  const HttpHandler handler;
  const HttpLimits limits;
  std::atomic<int> active{0};
  std::atomic<bool> stopped{false};

  absl::Mutex mu;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::weak_ptr<Session>> sessions ABSL_GUARDED_BY(mu);

  absl::Mutex log_mu;
  absl::Time log_window_start ABSL_GUARDED_BY(log_mu) = absl::InfinitePast();
  int log_lines ABSL_GUARDED_BY(log_mu) = 0;
  int64_t log_suppressed ABSL_GUARDED_BY(log_mu) = 0;
};

// One connection. Everything below runs on the connection's strand (the
// executor of stream_), except the Post* entry points the exchange calls.
//
// Phases: kReading (waiting for / parsing a request) -> kHandling (the handler
// owns the exchange; a "monitor" read is pending to notice a disconnect and
// keep pipelined bytes) -> kReading again (keep-alive) or kLingering (closing).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerState> state, bool admitted)
      : state_(std::move(state)), stream_(std::move(socket)), admitted_(admitted) {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    peer_ = ec ? "?" : absl::StrCat(ep.address().to_string(), ":", ep.port());
    // SSE events are small and latency matters more than packet count.
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  ~Session() {
    Release();
    absl::MutexLock l(&state_->mu);
    state_->sessions.erase(id_);
  }

  void Start() {
    if (admitted_) {
      absl::MutexLock l(&state_->mu);
      id_ = ++state_->next_id;
      state_->sessions[id_] = weak_from_this();
    }
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->admitted_) {
        self->state_->LogRejection(self->peer_, "too many connections, answered 503");
        self->RejectAndClose(503, "the server has too many open connections; retry later");
        return;
      }
      if (self->state_->stopped.load()) return self->Close();
      self->ReadRequest();
    });
  }

  // Closes now; an exchange still unanswered or streaming sees its client gone.
  void Close() {
    if (closed_) return;
    closed_ = true;
    Release();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    out_.clear();
    // Before the response completed: the handler learns the client is gone.
    if (auto ex = exchange_.lock()) ex->MarkGone();
    exchange_.reset();
  }

  void PostClose() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  // Entry points for HttpExchange (any thread).
  void PostReply(HttpResponse r) {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), r = std::move(r)]() mutable { self->DoReply(std::move(r)); });
  }
  void PostStreamStart(int status, HeaderList headers) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), status, h = std::move(headers)]() mutable {
      self->DoStreamStart(status, std::move(h));
    });
  }
  void PostEvent(std::string event) {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), e = std::move(event)]() mutable { self->DoEvent(std::move(e)); });
  }
  void PostStreamEnd() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->DoStreamEnd(); });
  }
  void PostAbort() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->phase_ == Phase::kHandling) self->Close();
    });
  }

 private:
  enum class Phase { kReading, kHandling, kLingering };

  // --- Reading a request ---------------------------------------------------

  void ReadRequest() {
    phase_ = Phase::kReading;
    parser_.emplace();
    parser_->header_limit(
        static_cast<uint32_t>(std::min<size_t>(state_->limits.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(state_->limits.max_body_bytes);
    if (first_request_ || buffer_.size() > 0) return ReadHeader();
    // Between keep-alive requests the idle timeout applies until the next
    // request's first byte; then the header timeout starts.
    stream_.expires_after(ToChrono(state_->limits.idle_timeout));
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              if (self->closed_) return;
                              if (ec) return self->Close();  // Idle timeout or the client left: normal.
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    first_request_ = false;
    stream_.expires_after(ToChrono(state_->limits.header_timeout));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               if (self->closed_) return;
                               if (ec) return self->OnReadError(ec, "headers");
                               auto& msg = self->parser_->get();
                               if (!self->parser_->is_done() &&
                                   absl::EqualsIgnoreCase(View(msg[bhttp::field::expect]), "100-continue")) {
                                 // curl and others wait for this before sending a large body.
                                 self->Queue("HTTP/1.1 100 Continue\r\n\r\n");
                               }
                               if (self->parser_->is_done()) return self->Dispatch();
                               self->ReadBody();
                             });
  }

  void ReadBody() {
    stream_.expires_after(ToChrono(state_->limits.body_timeout));
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) return self->OnReadError(ec, "body");
      self->Dispatch();
    });
  }

  void OnReadError(beast::error_code ec, absl::string_view part) {
    if (ec == beast::error::timeout) {
      state_->LogRejection(peer_, absl::StrCat("timed out reading the request ", part, ", closed"));
      return Close();
    }
    if (ec.category() != bhttp::make_error_code(bhttp::error::end_of_stream).category() ||
        ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message) {
      return Close();  // The client left (or a socket error): nobody to answer.
    }
    if (ec == bhttp::error::body_limit) {
      state_->LogRejection(peer_, "request body over the limit, answered 413");
      return RejectAndClose(
          413, absl::StrCat("request body exceeds the limit of ", state_->limits.max_body_bytes, " bytes"));
    }
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
      state_->LogRejection(peer_, "request headers over the limit, answered 431");
      return RejectAndClose(431, absl::StrCat("request headers exceed the limit of ",
                                              state_->limits.max_header_bytes, " bytes"));
    }
    state_->LogRejection(peer_, absl::StrCat("malformed request (", ec.message(), "), answered 400"));
    RejectAndClose(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  void Dispatch() {
    if (state_->stopped.load()) return Close();
    bhttp::request<bhttp::string_body> msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();
    http10_ = msg.version() < 11;
    head_ = msg.method() == bhttp::verb::head;

    HttpRequest req;
    req.method = std::string(View(msg.method_string()));
    req.target = std::string(View(msg.target()));
    req.path = TargetPath(req.target);
    for (const auto& field : msg) {
      std::string name = absl::AsciiStrToLower(View(field.name_string()));
      absl::string_view value = View(field.value());
      auto [it, inserted] = req.headers.try_emplace(name, value);
      if (!inserted) absl::StrAppend(&it->second, ", ", value);
    }
    req.body = std::move(msg.body());
    req.peer = peer_;

    phase_ = Phase::kHandling;
    response_done_ = false;
    auto exchange = std::make_shared<HttpExchange>(shared_from_this());
    exchange_ = exchange;
    StartMonitor();
    try {
      state_->handler(std::move(req), std::move(exchange));
    } catch (const std::exception& e) {
      // Handlers should not throw; if one does, this request fails, not the process.
      LOG(ERROR) << "http: handler threw: " << e.what();
      if (auto ex = exchange_.lock())
        ex->Reply({.status = 500, .body = OpenAiErrorJson("internal error", "server_error")});
    }
  }

  // A read kept pending while the handler works: its completion with an
  // error is the disconnect signal. Bytes a pipelining client sends early are
  // kept for the next request, up to the header limit.
  void StartMonitor() {
    if (monitoring_ || closed_ || buffer_.size() >= state_->limits.max_header_bytes) return;
    monitoring_ = true;
    stream_.expires_never();  // Only the read timer: a pending write keeps its own.
    stream_.async_read_some(
        buffer_.prepare(kReadChunk), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->monitoring_ = false;
          self->buffer_.commit(n);
          if (self->closed_) return;
          if (self->phase_ == Phase::kLingering)
            return ec && ec != asio::error::operation_aborted ? self->Close() : self->Linger();
          if (self->phase_ == Phase::kHandling) {
            if (ec) return self->Close();  // Client gone.
            return self->StartMonitor();
          }
          // The response finished and cancelled this read to make way for the next request.
          if (ec && ec != asio::error::operation_aborted) return self->Close();
          self->ReadRequest();
        });
  }

  // --- Writing the response ------------------------------------------------

  std::string Head(int status, const std::string& content_type, const HeaderList& headers,
                   std::optional<size_t> content_length, bool chunked) {
    std::string out =
        absl::StrCat(http10_ ? "HTTP/1.0 " : "HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
    if (!content_type.empty()) absl::StrAppend(&out, "Content-Type: ", content_type, "\r\n");
    if (content_length) absl::StrAppend(&out, "Content-Length: ", *content_length, "\r\n");
    if (chunked) out += "Transfer-Encoding: chunked\r\n";
    for (const auto& [name, value] : headers) {
      if (SafeHeader(name, value)) {
        absl::StrAppend(&out, name, ": ", value, "\r\n");
      } else {
        LOG(ERROR) << "http: dropped response header \"" << absl::CEscape(name) << "\"";
      }
    }
    out += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    out += "\r\n";
    return out;
  }

  static int ValidStatus(int status) {
    if (status >= 200 && status <= 599) return status;
    LOG(ERROR) << "http: handler used status " << status << "; sending 500";
    return 500;
  }

  void DoReply(HttpResponse r) {
    if (closed_ || phase_ != Phase::kHandling) return;
    int status = ValidStatus(r.status);
    CountResponse(status);
    // 204 and 304 carry no body and no length.
    bool no_body = status == 204 || status == 304;
    std::string out = Head(status, no_body ? "" : r.content_type, r.headers,
                           no_body ? std::nullopt : std::optional<size_t>(r.body.size()), false);
    if (!no_body && !head_) out += r.body;
    response_done_ = true;
    Queue(std::move(out));
  }

  void DoStreamStart(int status, HeaderList headers) {
    if (closed_ || phase_ != Phase::kHandling) return;
    status = ValidStatus(status);
    CountResponse(status);
    // Proxies must not buffer or cache a token stream.
    bool has_cache_control = false;
    for (const auto& h : headers) has_cache_control |= absl::EqualsIgnoreCase(h.first, "cache-control");
    if (!has_cache_control) headers.emplace_back("Cache-Control", "no-cache");
    // HTTP/1.0 has no chunked encoding: the stream ends when the connection does.
    if (http10_) keep_alive_ = false;
    Queue(Head(status, "text/event-stream", headers, std::nullopt, !http10_));
  }

  void DoEvent(std::string event) {
    if (closed_ || phase_ != Phase::kHandling || head_) return;
    if (http10_) return Queue(std::move(event));
    Queue(absl::StrCat(absl::Hex(event.size()), "\r\n", event, "\r\n"));
  }

  void DoStreamEnd() {
    if (closed_ || phase_ != Phase::kHandling) return;
    response_done_ = true;
    Queue(http10_ || head_ ? "" : "0\r\n\r\n");
  }

  void Queue(std::string bytes) {
    if (!bytes.empty()) out_.push_back(std::move(bytes));
    StartWrite();
  }

  void StartWrite() {
    if (writing_ || closed_) return;
    if (out_.empty()) return OnOutputDrained();
    writing_ = true;
    // Everything queued goes out in one gather write: events that pile up
    // while the client is slow cost one syscall, not one each.
    in_flight_.assign(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
    out_.clear();
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(in_flight_.size());
    for (const auto& s : in_flight_) buffers.push_back(asio::buffer(s));
    stream_.expires_after(
        ToChrono(state_->limits.write_timeout));  // Sets only the write timer if a read is pending.
    asio::async_write(stream_, buffers, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->in_flight_.clear();
      if (self->closed_) return;
      if (ec) return self->Close();  // A failed write means the client is gone.
      self->StartWrite();
    });
  }

  void OnOutputDrained() {
    if (phase_ == Phase::kLingering) return Linger();
    if (phase_ != Phase::kHandling || !response_done_) return;
    // The response is complete: this exchange no longer sees disconnects.
    exchange_.reset();
    phase_ = Phase::kReading;
    if (!keep_alive_ || state_->stopped.load()) return StartLinger();
    if (monitoring_) {
      stream_.cancel();  // Its completion starts the next request.
    } else {
      ReadRequest();
    }
  }

  // --- Closing -------------------------------------------------------------

  void RejectAndClose(int status, std::string message) {
    CountResponse(status);
    keep_alive_ = false;
    std::string body = OpenAiErrorJson(message, status >= 500 ? "server_error" : "invalid_request_error");
    phase_ = Phase::kLingering;
    Queue(Head(status, "application/json", {}, body.size(), false) + body);
  }

  void StartLinger() {
    phase_ = Phase::kLingering;
    Linger();
  }

  // Half-closes, then discards what the client still sends until it closes
  // too or kLinger passes, so the response reaches it intact.
  void Linger() {
    Release();
    if (monitoring_) {
      stream_.cancel();  // Only one read at a time; its completion comes back here.
      return;
    }
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Close();
    stream_.expires_after(kLinger);
    DrainLoop();
  }

  void DrainLoop() {
    stream_.async_read_some(asio::buffer(drain_, sizeof(drain_)),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (self->closed_) return;
                              if (ec) return self->Close();
                              self->DrainLoop();  // Same absolute deadline: the whole linger is bounded.
                            });
  }

  // Gives the connection's slot back, once.
  void Release() {
    if (admitted_ && !released_) {
      released_ = true;
      state_->active.fetch_sub(1);
    }
  }

 private:
  const std::shared_ptr<ServerState> state_;
  beast::tcp_stream stream_;
  const bool admitted_;
  std::string peer_;
  uint64_t id_ = 0;

  Phase phase_ = Phase::kReading;
  bool closed_ = false;
  bool released_ = false;
  bool first_request_ = true;

  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool keep_alive_ = false;
  bool http10_ = false;
  bool head_ = false;

  std::weak_ptr<HttpExchange> exchange_;  // Weak: the handler owns the exchange.
  bool response_done_ = false;            // The last byte of the response is queued.
  bool monitoring_ = false;

  std::deque<std::string> out_;
  std::vector<std::string> in_flight_;
  bool writing_ = false;
  char drain_[kReadChunk];
};

}  // namespace internal

// --- HttpExchange ------------------------------------------------------------

HttpExchange::HttpExchange(std::shared_ptr<internal::Session> session) : session_(std::move(session)) {}

HttpExchange::~HttpExchange() {
  if (gone_.load()) return;
  State state;
  {
    absl::MutexLock l(&mu_);
    state = state_;
  }
  if (state == State::kNew) {
    LOG(ERROR) << "http: request dropped by its handler without a response; sending 500";
    session_->PostReply(
        {.status = 500, .body = OpenAiErrorJson("the server dropped the request", "server_error")});
  } else if (state == State::kStreaming) {
    session_->PostAbort();
  }
}

bool HttpExchange::Advance(State from, State to, const char* call) {
  if (gone_.load()) return false;
  if (state_ != from) {
    LOG(ERROR) << "http: " << call
               << (from == State::kNew ? " on an exchange that already answered" : " outside a stream") << "; ignored";
    return false;
  }
  state_ = to;
  return true;
}

void HttpExchange::Reply(HttpResponse response) {
  absl::MutexLock l(&mu_);
  if (Advance(State::kNew, State::kReplied, "Reply")) session_->PostReply(std::move(response));
}

void HttpExchange::StartStream(int status, HeaderList headers) {
  absl::MutexLock l(&mu_);
  if (Advance(State::kNew, State::kStreaming, "StartStream")) session_->PostStreamStart(status, std::move(headers));
}

void HttpExchange::SendEvent(std::string_view data) {
  std::string event = EncodeEvent(data);  // Outside the lock.
  absl::MutexLock l(&mu_);
  if (Advance(State::kStreaming, State::kStreaming, "SendEvent")) session_->PostEvent(std::move(event));
}

void HttpExchange::EndStream() {
  absl::MutexLock l(&mu_);
  if (Advance(State::kStreaming, State::kEnded, "EndStream")) session_->PostStreamEnd();
}

void HttpExchange::OnClientGone(std::function<void()> fn) {
  {
    absl::MutexLock l(&mu_);
    if (!gone_.load()) {
      on_gone_ = std::move(fn);
      return;
    }
  }
  if (fn) fn();
}

void HttpExchange::MarkGone() {
  std::function<void()> fn;
  {
    absl::MutexLock l(&mu_);
    if (gone_.exchange(true)) return;
    fn = std::move(on_gone_);
    on_gone_ = nullptr;
  }
  if (fn) fn();
}

// --- HttpServer --------------------------------------------------------------

namespace {

void Accept(const std::shared_ptr<internal::ServerState>& state) {
  auto& io = static_cast<asio::io_context&>(state->acceptor.get_executor().context());
  state->acceptor.async_accept(asio::make_strand(io), [state](beast::error_code ec, tcp::socket socket) {
    if (state->stopped.load() || !state->acceptor.is_open()) return;
    if (ec) {
      // EMFILE and friends: retry shortly instead of spinning.
      state->LogRejection("accept", ec.message());
      state->retry_timer.expires_after(std::chrono::milliseconds(100));
      state->retry_timer.async_wait([state](beast::error_code wec) {
        if (!wec) Accept(state);
      });
      return;
    }
    bool admitted = state->active.fetch_add(1) < state->limits.max_connections;
    if (!admitted) state->active.fetch_sub(1);
    std::make_shared<internal::Session>(std::move(socket), state, admitted)->Start();
    Accept(state);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(asio::io_context& io,
                                                              const std::string& address, HttpHandler handler,
                                                              HttpLimits limits) {
  if (!handler) return absl::InvalidArgumentError("HttpServer needs a handler");
  auto state = std::make_shared<internal::ServerState>(io, std::move(handler), limits);
  RETURN_IF_ERROR(Listen(state->acceptor, address));
  std::unique_ptr<HttpServer> server(new HttpServer(state));
  server->port_ = state->acceptor.local_endpoint().port();
  // The acceptor is used only on its strand from here on.
  asio::post(state->acceptor.get_executor(), [state] { Accept(state); });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::connections() const { return state_->active.load(); }

void HttpServer::Stop() {
  if (state_->stopped.exchange(true)) return;
  asio::post(state_->acceptor.get_executor(), [state = state_] {
    beast::error_code ec;
    state->acceptor.close(ec);
    state->retry_timer.cancel();
  });
  std::vector<std::shared_ptr<internal::Session>> live;
  {
    absl::MutexLock l(&state_->mu);
    for (auto& [id, weak] : state_->sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->PostClose();
}

}  // namespace duet::http

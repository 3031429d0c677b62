#include "http/sse.h"

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/io_thread.h"
#include "http/server.h"

namespace duet::http {
namespace {

std::vector<std::string> ParseInPieces(const std::string& stream, size_t piece) {
  SseParser p;
  std::vector<std::string> out;
  for (size_t at = 0; at < stream.size(); at += piece) {
    p.Feed(absl::string_view(stream).substr(at, piece), [&](absl::string_view d) { out.emplace_back(d); });
  }
  return out;
}

TEST_CASE("the SSE parser finds the same events however the bytes are split", "[http]") {
  // LF, CRLF and CR line ends; a comment; a field other than data; a data
  // field without a value; an event with no data (yields nothing); a last
  // event without its blank line (not yet dispatched).
  const std::string stream =
      "data: a\n\n"
      "data: b\r\ndata:c\r\n\r\n"
      ": keep-alive\n\n"
      "id: 7\rdata:  two spaces\r\r"
      "event: x\n\n"
      "data\n\n"
      "data: [DONE]\n\n"
      "data: unfinished\n";
  const std::vector<std::string> want = {"a", "b\nc", " two spaces", "", "[DONE]"};
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    INFO("pieces of " << piece << " bytes");
    REQUIRE(ParseInPieces(stream, piece) == want);
  }
}

struct Read {
  absl::Status status;
  std::string body;
  size_t wire = 0;
  int pieces = 0;
  int http_status = 0;
};

Read ReadInPieces(const std::string& response, size_t piece, bool close_at_end) {
  ResponseReader r;
  Read out;
  for (size_t at = 0; at < response.size() && out.status.ok(); at += piece) {
    out.status = r.Feed(absl::string_view(response).substr(at, piece), [&](absl::string_view p, size_t wire) {
      out.body.append(p.data(), p.size());
      out.wire += wire;
      ++out.pieces;
    });
  }
  if (out.status.ok() && close_at_end) out.status = r.Close();
  if (out.status.ok() && !r.complete()) out.status = absl::UnavailableError("incomplete");
  out.http_status = r.status();
  return out;
}

TEST_CASE("the response reader de-chunks and counts the wire bytes of each chunk", "[http]") {
  const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n";
  const std::string chunks = "9\r\ndata: a\n\n\r\n10;ext=1\r\ndata: 01234567\n\n\r\n0\r\n\r\n";
  const std::string response = head + chunks + "HTTP/1.1 200 OK\r\n";  // bytes past the end are ignored
  for (size_t piece = 1; piece <= response.size(); ++piece) {
    INFO("pieces of " << piece << " bytes");
    Read r = ReadInPieces(response, piece, /*close_at_end=*/false);
    INFO(r.status.ToString());
    REQUIRE(r.status.ok());
    CHECK(r.http_status == 200);
    CHECK(r.body == "data: a\n\ndata: 01234567\n\n");
    CHECK(r.pieces == 2);
    CHECK(r.wire == chunks.size() - 5);  // everything but the last chunk
  }
}

TEST_CASE("the response reader reads sized and close-delimited bodies", "[http]") {
  Read sized = ReadInPieces("HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nhello and more", 3, false);
  CHECK(sized.status.ok());
  CHECK(sized.http_status == 404);
  CHECK(sized.body == "hello");
  Read to_close = ReadInPieces("HTTP/1.0 200 OK\r\n\r\ndata: x\n\n", 4, /*close_at_end=*/true);
  REQUIRE(to_close.status.ok());
  CHECK(to_close.http_status == 200);
  CHECK(to_close.body == "data: x\n\n");
}

TEST_CASE("the response reader rejects bad framing and a cut-off body", "[http]") {
  CHECK(ReadInPieces("HTP/1.1 200 OK\r\n\r\n", 100, false).status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReadInPieces("HTTP/1.1 abc OK\r\n\r\n", 100, false).status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReadInPieces("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n", 100, false).status.code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ReadInPieces("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxxyy", 100, false).status.code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ReadInPieces("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxx\r\n", 100, true).status.code() ==
        absl::StatusCode::kUnavailable);
  CHECK(ReadInPieces("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", 100, true).status.code() ==
        absl::StatusCode::kUnavailable);
}

// A real server: /stream sends three events and [DONE] from another thread;
// /cut sends one event and drops the exchange mid-stream; anything else 404.
struct StreamServer {
  IoThread io;
  std::vector<std::thread> threads;
  std::unique_ptr<HttpServer> server;
  std::string last_body;
  absl::Notification event_seen;  // /cut: the client has its event

  StreamServer() {
    auto s = HttpServer::Start(io.context(), "127.0.0.1:0", [this](HttpRequest req, HttpExchangePtr ex) {
      last_body = req.body;
      if (req.path == "/stream") {
        ex->StartStream(200, {});
        threads.emplace_back([ex] {
          for (const char* e : {R"({"i":1})", "two\nlines", R"({"i":3})", "[DONE]"}) ex->SendEvent(e);
          ex->EndStream();
        });
      } else if (req.path == "/cut") {
        ex->StartStream(200, {});
        threads.emplace_back([this, ex]() mutable {
          ex->SendEvent("only");
          // Dropped mid-stream once the client has the event: the connection closes.
          event_seen.WaitForNotificationWithTimeout(absl::Seconds(10));
          ex.reset();
        });
      } else {
        ex->Reply({.status = 404, .body = OpenAiErrorJson("no such route")});
      }
    });
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  ~StreamServer() {
    for (auto& t : threads) t.join();
  }
};

TEST_CASE("StreamPost delivers a real server's events in order", "[http]") {
  StreamServer s;
  std::vector<std::string> events;
  auto r = StreamPost("127.0.0.1", s.server->port(), "/stream", R"({"stream":true})", absl::Seconds(10),
                      [&](absl::string_view d) {
                        events.emplace_back(d);
                        return true;
                      });
  REQUIRE(r.ok());
  CHECK(r->status == 200);
  CHECK(r->complete);
  CHECK(events == std::vector<std::string>{R"({"i":1})", "two\nlines", R"({"i":3})", "[DONE]"});
  CHECK(s.last_body == R"({"stream":true})");
}

TEST_CASE("StreamPost returns an error answer's body, stops when asked, and fails on a cut stream", "[http]") {
  StreamServer s;
  int events = 0;
  auto count = [&](absl::string_view) { return ++events < 2; };
  SECTION("404") {
    auto r = StreamPost("127.0.0.1", s.server->port(), "/nothing", "{}", absl::Seconds(10), count);
    REQUIRE(r.ok());
    CHECK(r->status == 404);
    CHECK(r->body.find("no such route") != std::string::npos);
    CHECK(events == 0);
  }
  SECTION("stop after the second event") {
    auto r = StreamPost("127.0.0.1", s.server->port(), "/stream", "{}", absl::Seconds(10), count);
    REQUIRE(r.ok());
    CHECK(events == 2);  // Nothing after the callback said stop.
  }
  SECTION("cut mid-stream") {
    auto r = StreamPost("127.0.0.1", s.server->port(), "/cut", "{}", absl::Seconds(10), [&](absl::string_view) {
      ++events;
      s.event_seen.Notify();
      return true;
    });
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
    CHECK(events == 1);
  }
  SECTION("nobody listening") {
    const int port = s.server->port();
    s.server->Stop();
    auto r = StreamPost("127.0.0.1", port, "/stream", "{}", absl::Seconds(10), count);
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace duet::http

#include "http/client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace duet::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace asio = boost::asio;

namespace {

// Connects `socket`, with `timeout` on every later read and write: Beast's
// expiry only bounds asynchronous operations, and these are synchronous, so
// the socket itself carries the deadline.
void Connect(asio::io_context& io, beast::tcp_stream& stream, const std::string& host, int port,
             absl::Duration timeout) {
  asio::ip::tcp::resolver resolver(io);
  stream.expires_after(absl::ToChronoMilliseconds(timeout));
  stream.connect(resolver.resolve(host, std::to_string(port)));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
  setsockopt(stream.socket().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(stream.socket().native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

template <typename Stream>
HttpResult Exchange(Stream& stream, const std::string& host, const std::string& method, const std::string& target,
                    const std::string& body, const std::map<std::string, std::string>& headers) {
  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  req.set(bhttp::field::host, host);
  req.set(bhttp::field::user_agent, "duet");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() || method == "POST") {
    if (headers.find("Content-Type") == headers.end()) req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
  }
  bhttp::write(stream, req);
  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(256u << 20);
  bhttp::read(stream, buffer, parser);
  auto& res = parser.get();
  HttpResult out;
  out.status = res.result_int();
  for (const auto& h : res) out.headers[absl::AsciiStrToLower(std::string(h.name_string()))] = std::string(h.value());
  out.body = res.body();
  return out;
}

}  // namespace

absl::StatusOr<HttpResult> HttpCall(const std::string& host, int port, const std::string& method,
                                    const std::string& target, const std::string& body,
                                    absl::Duration timeout,
                                    const std::map<std::string, std::string>& headers) {
  try {
    asio::io_context io;
    beast::tcp_stream stream(io);
    Connect(io, stream, host, port, timeout);
    HttpResult out = Exchange(stream, host, method, target, body, headers);
    beast::error_code ec;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    return out;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(method, " http://", host, ":", port, target, ": ", e.what()));
  }
}

absl::StatusOr<Endpoint> ParseEndpoint(const std::string& url) {
  Endpoint e;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    e.tls = true;
  } else if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an http:// or https:// URL"));
  }
  rest = rest.substr(0, rest.find('/'));
  e.port = e.tls ? 443 : 80;
  const size_t colon = rest.rfind(':');
  if (colon != absl::string_view::npos && rest.find(']', colon) == absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(colon + 1), &e.port) || e.port <= 0 || e.port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "' has a bad port"));
    }
    rest = rest.substr(0, colon);
  }
  if (absl::ConsumePrefix(&rest, "[")) absl::ConsumeSuffix(&rest, "]");
  if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat("'", url, "' names no host"));
  e.host = std::string(rest);
  return e;
}

absl::StatusOr<HttpResult> HttpCall(const Endpoint& to, const std::string& method, const std::string& target,
                                    const std::string& body, absl::Duration timeout,
                                    const std::map<std::string, std::string>& headers) {
  if (!to.tls) return HttpCall(to.host, to.port, method, target, body, timeout, headers);
  try {
    asio::io_context io;
    asio::ssl::context ctx(asio::ssl::context::tls_client);
    if (to.ca_file.empty()) {
      ctx.set_default_verify_paths();
    } else {
      ctx.load_verify_file(to.ca_file);
    }
    ctx.set_verify_mode(asio::ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(io, ctx);
    // The server's certificate must name the host (a DNS name or an IP
    // address), and SNI tells it which one is asked for.
    stream.set_verify_callback(asio::ssl::host_name_verification(to.host));
    if (!SSL_set_tlsext_host_name(stream.native_handle(), to.host.c_str())) {
      return absl::InternalError("TLS: cannot set the server name");
    }
    Connect(io, beast::get_lowest_layer(stream), to.host, to.port, timeout);
    stream.handshake(asio::ssl::stream_base::client);
    HttpResult out = Exchange(stream, to.host, method, target, body, headers);
    beast::error_code ec;
    stream.shutdown(ec);  // A peer that just closes is fine: the response is read.
    return out;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(method, " https://", to.host, ":", to.port, target, ": ", e.what()));
  }
}

}  // namespace duet::http

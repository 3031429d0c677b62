#include "http/client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace duet::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace asio = boost::asio;

absl::StatusOr<HttpResult> HttpCall(const std::string& host, int port, const std::string& method,
                                    const std::string& target, const std::string& body,
                                    absl::Duration timeout,
                                    const std::map<std::string, std::string>& headers) {
  try {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_after(absl::ToChronoMilliseconds(timeout));
    stream.connect(resolver.resolve(host, std::to_string(port)));
    // Beast's expiry only bounds asynchronous operations; these reads and
    // writes are synchronous, so the socket itself carries the deadline.
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
    tv.tv_usec = static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000);
    setsockopt(stream.socket().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(stream.socket().native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
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
    beast::error_code ec;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    return out;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(method, " http://", host, ":", port, target, ": ", e.what()));
  }
}

}  // namespace duet::http

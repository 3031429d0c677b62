// The client over TLS, as the Kubernetes actuator reaches the API server:
// against a TLS server on loopback whose certificate (made here by the
// openssl command) names 127.0.0.1, a call trusting that certificate's CA
// gets the response; one trusting another CA, or asking under a name the
// certificate lacks, is refused before any request is sent. And
// ParseEndpoint reads what the actuator is given.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <catch2/catch.hpp>
#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "base/subprocess.h"
#include "http/client.h"

namespace duet::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace fs = std::filesystem;

// A self-signed certificate (its own CA) for the subject alternative names `san`.
struct Cert {
  std::string cert, key;
};
Cert MakeCert(const std::string& name, const std::string& san = "IP:127.0.0.1,DNS:localhost") {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::create_directories(dir);
  Cert c{(dir / "cert.pem").string(), (dir / "key.pem").string()};
  auto r = RunCommand({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                       "-nodes", "-days", "1", "-subj", "/CN=duet-test", "-addext",
                       "subjectAltName=" + san, "-keyout", c.key, "-out", c.cert},
                      absl::Seconds(30));
  REQUIRE(r.ok());
  REQUIRE(WIFEXITED(r->status));
  REQUIRE(WEXITSTATUS(r->status) == 0);
  return c;
}

// Serves `n` connections, one request each: 200 with the request's method
// and target as the body. A failed handshake ends that connection.
class TlsServer {
 public:
  TlsServer(const Cert& c, int n) : ctx_(asio::ssl::context::tls_server), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    ctx_.use_certificate_chain_file(c.cert);
    ctx_.use_private_key_file(c.key, asio::ssl::context::pem);
    thread_ = std::thread([this, n] {
      for (int i = 0; i < n; ++i) {
        asio::ip::tcp::socket s(io_);
        acceptor_.accept(s);
        // A client that gives up mid-handshake must not hold the loop.
        timeval tv{.tv_sec = 5, .tv_usec = 0};
        setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        beast::ssl_stream<asio::ip::tcp::socket> tls(std::move(s), ctx_);
        beast::error_code ec;
        tls.handshake(asio::ssl::stream_base::server, ec);
        if (ec) continue;
        beast::flat_buffer buf;
        bhttp::request<bhttp::string_body> req;
        bhttp::read(tls, buf, req, ec);
        if (ec) continue;
        ++served_;
        bhttp::response<bhttp::string_body> res{bhttp::status::ok, 11};
        res.body() = std::string(req.method_string()) + " " + std::string(req.target()) + " " +
                     std::string(req[bhttp::field::authorization]);
        res.prepare_payload();
        bhttp::write(tls, res, ec);
        tls.shutdown(ec);
      }
    });
  }
  ~TlsServer() { thread_.join(); }
  int port() const { return acceptor_.local_endpoint().port(); }
  int served() const { return served_; }

 private:
  asio::io_context io_;
  asio::ssl::context ctx_;
  asio::ip::tcp::acceptor acceptor_;
  std::atomic<int> served_{0};
  std::thread thread_;
};

TEST_CASE("https: the server's certificate is checked against the CA file and the host") {
  const Cert server = MakeCert("server"), other = MakeCert("other");
  TlsServer s(server, 2);
  Endpoint ok{.tls = true, .host = "127.0.0.1", .port = s.port(), .ca_file = server.cert};
  absl::StatusOr<HttpResult> r = HttpCall(ok, "PATCH", "/apis/x/scale", R"({"spec":{"replicas":2}})",
                                          absl::Seconds(10), {{"Authorization", "Bearer t"}});
  REQUIRE(r.ok());
  CHECK(r->status == 200);
  CHECK(r->body == "PATCH /apis/x/scale Bearer t");

  Endpoint untrusted = ok;
  untrusted.ca_file = other.cert;
  r = HttpCall(untrusted, "GET", "/");
  REQUIRE_FALSE(r.ok());
  CHECK(absl::StrContains(r.status().message(), "certificate verify failed"));

  // A certificate from the trusted CA that names another host.
  const Cert elsewhere = MakeCert("elsewhere", "DNS:elsewhere.test");
  TlsServer s2(elsewhere, 1);
  Endpoint misnamed{.tls = true, .host = "127.0.0.1", .port = s2.port(), .ca_file = elsewhere.cert};
  r = HttpCall(misnamed, "GET", "/");
  REQUIRE_FALSE(r.ok());
  CHECK(absl::StrContains(r.status().message(), "certificate verify failed"));
  CHECK(s.served() == 1);  // only the trusted call got to send its request
  CHECK(s2.served() == 0);
}

TEST_CASE("ParseEndpoint") {
  absl::StatusOr<Endpoint> e = ParseEndpoint("https://10.96.0.1:443");
  REQUIRE(e.ok());
  CHECK(e->tls);
  CHECK(e->host == "10.96.0.1");
  CHECK(e->port == 443);
  e = ParseEndpoint("http://duet-router:8000/v1");
  REQUIRE(e.ok());
  CHECK_FALSE(e->tls);
  CHECK(e->host == "duet-router");
  CHECK(e->port == 8000);
  e = ParseEndpoint("https://[fd00::1]");
  REQUIRE(e.ok());
  CHECK(e->host == "fd00::1");
  CHECK(e->port == 443);
  e = ParseEndpoint("https://[fd00::1]:6443");
  REQUIRE(e.ok());
  CHECK(e->port == 6443);
  CHECK_FALSE(ParseEndpoint("duet-router:8000").ok());
  CHECK_FALSE(ParseEndpoint("http://host:99999").ok());
  CHECK_FALSE(ParseEndpoint("http://:80").ok());
}

}  // namespace
}  // namespace duet::http

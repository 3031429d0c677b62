// A blocking HTTP/1.1 client for tools and tests: one request per call,
// over TCP or TLS (the server's certificate checked against a CA file or the
// system's, and against the host name).
//
//   ASSIGN_OR_RETURN(HttpResult r, HttpCall("127.0.0.1", 8000, "GET", "/health"));
//   if (r.status == 200) ...
//   ASSIGN_OR_RETURN(Endpoint api, ParseEndpoint("https://10.0.0.1:443"));
//   api.ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
//   ASSIGN_OR_RETURN(r, HttpCall(api, "GET", "/version"));
//
// Not for the data path (the router never calls out over HTTP).
#ifndef DUET_HTTP_CLIENT_H_
#define DUET_HTTP_CLIENT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet::http {

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;  // Lower-case names.
  std::string body;
};

absl::StatusOr<HttpResult> HttpCall(const std::string& host, int port, const std::string& method,
                                    const std::string& target, const std::string& body = "",
                                    absl::Duration timeout = absl::Seconds(30),
                                    const std::map<std::string, std::string>& headers = {});

// Where to send: "http://HOST[:PORT]" or "https://HOST[:PORT]" (a path is
// ignored; [IPv6] in brackets).
struct Endpoint {
  bool tls = false;
  std::string host;
  int port = 0;
  std::string ca_file;  // TLS: the CAs that may sign the server's certificate (empty: the system's)
};
absl::StatusOr<Endpoint> ParseEndpoint(const std::string& url);

absl::StatusOr<HttpResult> HttpCall(const Endpoint& to, const std::string& method, const std::string& target,
                                    const std::string& body = "", absl::Duration timeout = absl::Seconds(30),
                                    const std::map<std::string, std::string>& headers = {});

}  // namespace duet::http

#endif  // DUET_HTTP_CLIENT_H_

// A blocking HTTP/1.1 client for tools and tests: one request per call.
//
//   ASSIGN_OR_RETURN(HttpResult r, HttpCall("127.0.0.1", 8000, "GET", "/health"));
//   if (r.status == 200) ...
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

}  // namespace duet::http

#endif  // DUET_HTTP_CLIENT_H_

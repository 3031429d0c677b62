#include "http/sse.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace duet::http {

// --- SseParser ----------------------------------------------------------------

void SseParser::Feed(absl::string_view bytes, const EventFn& on_event) {
  for (char c : bytes) {
    if (c == '\n' && after_cr_) {  // The LF of a CRLF: the CR ended the line.
      after_cr_ = false;
      continue;
    }
    after_cr_ = c == '\r';
    if (c == '\n' || c == '\r') {
      Line(line_, on_event);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::Line(absl::string_view line, const EventFn& on_event) {
  if (line.empty()) {  // The blank line dispatches the event.
    if (has_data_) on_event(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // A comment.
  const size_t colon = line.find(':');
  const absl::string_view field = line.substr(0, colon);
  if (field != "data") return;
  absl::string_view value = colon == absl::string_view::npos ? "" : line.substr(colon + 1);
  absl::ConsumePrefix(&value, " ");
  if (has_data_) data_.push_back('\n');
  absl::StrAppend(&data_, value);
  has_data_ = true;
}

// --- ResponseReader -------------------------------------------------------------

absl::Status ResponseReader::ParseHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  const absl::string_view status_line = lines.front();
  // "HTTP/1.1 200 OK"
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") || !absl::SimpleAtoi(parts[1], &status_) ||
      status_ < 100 || status_ > 999) {
    return absl::InvalidArgumentError(absl::StrCat("bad HTTP status line: ", status_line.substr(0, 100)));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad HTTP header line: ", lines[i].substr(0, 100)));
    }
    headers_[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  auto te = headers_.find("transfer-encoding");
  auto cl = headers_.find("content-length");
  if (te != headers_.end() && absl::StrContains(absl::AsciiStrToLower(te->second), "chunked")) {
    framing_ = Framing::kChunked;
  } else if (cl != headers_.end()) {
    if (!absl::SimpleAtoi(cl->second, &left_) || left_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad Content-Length: ", cl->second));
    }
    framing_ = Framing::kSized;
    complete_ = left_ == 0;
  } else {
    framing_ = Framing::kToClose;
  }
  // No body: 1xx, 204, 304.
  if (status_ < 200 || status_ == 204 || status_ == 304) complete_ = true;
  return absl::OkStatus();
}

absl::Status ResponseReader::Feed(absl::string_view bytes, const BodyFn& on_body) {
  if (complete_) return absl::OkStatus();
  if (!head_done_) {
    pending_.append(bytes.data(), bytes.size());
    const size_t end = pending_.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (pending_.size() > (64u << 10)) return absl::InvalidArgumentError("HTTP head over 64 KiB");
      return absl::OkStatus();
    }
    const std::string rest = pending_.substr(end + 4);
    const absl::Status head = ParseHead(absl::string_view(pending_).substr(0, end));
    pending_.clear();
    if (!head.ok()) return head;
    head_done_ = true;
    return rest.empty() ? absl::OkStatus() : Feed(rest, on_body);
  }
  switch (framing_) {
    case Framing::kToClose:
      if (!bytes.empty()) on_body(bytes, bytes.size());
      return absl::OkStatus();
    case Framing::kSized: {
      const absl::string_view piece = bytes.substr(0, static_cast<size_t>(left_));
      left_ -= static_cast<int64_t>(piece.size());
      complete_ = left_ == 0;
      if (!piece.empty()) on_body(piece, piece.size());
      return absl::OkStatus();
    }
    case Framing::kChunked:
      break;
  }
  pending_.append(bytes.data(), bytes.size());
  size_t at = 0;
  while (!complete_) {
    const size_t crlf = pending_.find("\r\n", at);
    if (crlf == std::string::npos) break;
    // The size, then optional extensions after ';'.
    const absl::string_view size_field =
        absl::StripAsciiWhitespace(absl::string_view(pending_).substr(at, crlf - at).substr(
            0, absl::string_view(pending_).substr(at, crlf - at).find(';')));
    uint64_t len = 0;
    if (size_field.empty() || size_field.size() > 15 || !absl::SimpleHexAtoi(size_field, &len)) {
      return absl::InvalidArgumentError(absl::StrCat("bad chunk size: ", size_field.substr(0, 20)));
    }
    if (len == 0) {
      // The last chunk; trailers are not used by duet and not read.
      complete_ = true;
      at = crlf + 2;
      break;
    }
    const size_t framed = crlf + 2 - at + len + 2;
    if (pending_.size() - at < framed) break;
    if (pending_.compare(crlf + 2 + len, 2, "\r\n") != 0) {
      return absl::InvalidArgumentError("chunk not followed by CRLF");
    }
    on_body(absl::string_view(pending_).substr(crlf + 2, len), framed);
    at += framed;
  }
  pending_.erase(0, at);
  return absl::OkStatus();
}

absl::Status ResponseReader::Close() {
  if (head_done_ && framing_ == Framing::kToClose) complete_ = true;
  if (complete_) return absl::OkStatus();
  return absl::UnavailableError(head_done_ ? "the connection closed mid-body" : "the connection closed before a response");
}

// --- StreamPost -------------------------------------------------------------------

namespace {

// A connected TCP socket, or Unavailable.
absl::StatusOr<int> Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat(host, ":", port, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ", std::strerror(err)));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<StreamResult> StreamPost(const std::string& host, int port, const std::string& target,
                                        const std::string& body, absl::Duration timeout,
                                        const std::function<bool(absl::string_view data)>& on_event) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int> fd_or = Connect(host, port);
  if (!fd_or.ok()) return fd_or.status();
  const int fd = *fd_or;
  const std::string where = absl::StrCat("POST http://", host, ":", port, target);
  const std::string request =
      absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: ", host, "\r\nUser-Agent: duet\r\n",
                   "Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n",
                   "Content-Length: ", body.size(), "\r\n\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat(where, ": send: ", std::strerror(err)));
    }
    sent += static_cast<size_t>(n);
  }
  StreamResult out;
  ResponseReader reader;
  SseParser events;
  bool stopped = false;
  absl::Status status;
  const auto on_body = [&](absl::string_view piece, size_t) {
    if (reader.status() != 200) {
      out.body.append(piece.data(), piece.size());
      return;
    }
    events.Feed(piece, [&](absl::string_view data) {
      if (!stopped && !on_event(data)) stopped = true;
    });
  };
  char buf[16384];
  while (!reader.complete() && !stopped) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      status = absl::DeadlineExceededError(absl::StrCat(where, ": no complete response within ",
                                                        absl::FormatDuration(timeout)));
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) {
      status = absl::InternalError(absl::StrCat(where, ": poll: ", std::strerror(errno)));
      break;
    }
    if (ready <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = absl::UnavailableError(absl::StrCat(where, ": recv: ", std::strerror(errno)));
      break;
    }
    if (n == 0) {
      status = reader.Close();
      if (!status.ok()) status = absl::UnavailableError(absl::StrCat(where, ": ", status.message()));
      break;
    }
    status = reader.Feed(absl::string_view(buf, static_cast<size_t>(n)), on_body);
    if (!status.ok()) break;
  }
  close(fd);
  if (!status.ok()) return status;
  out.status = reader.status();
  out.complete = reader.complete();
  return out;
}

}  // namespace duet::http

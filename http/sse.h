// The client side of server-sent events, for tools, tests and benches: an
// incremental event-stream parser, an incremental HTTP/1.x response reader
// (head, then a chunked, sized or close-delimited body), and a blocking
// streaming POST built from the two. Every SSE consumer in duet reads events
// through these; the router's own stream writer is HttpExchange::SendEvent.
//
//   auto r = StreamPost("127.0.0.1", port, "/v1/completions", body, absl::Seconds(60),
//                       [&](absl::string_view data) { events.emplace_back(data); return true; });
//
// Not thread-safe; one object per stream. Not for the data path.
#ifndef DUET_HTTP_SSE_H_
#define DUET_HTTP_SSE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace duet::http {

// Splits an event stream (text/event-stream) into its events' data. Bytes may
// arrive in pieces of any size; an event ends at a blank line, lines end with
// LF, CRLF or CR. An event with at least one `data:` field yields its data
// (several fields joined by LF, one leading space dropped from each); comments
// and other fields are skipped.
class SseParser {
 public:
  using EventFn = std::function<void(absl::string_view data)>;
  void Feed(absl::string_view bytes, const EventFn& on_event);

 private:
  void Line(absl::string_view line, const EventFn& on_event);

  std::string line_;  // The incomplete line so far.
  bool after_cr_ = false;  // The last byte was CR: an LF next ends nothing new.
  std::string data_;
  bool has_data_ = false;
};

// Reads one HTTP/1.x response from the bytes a socket delivers, in pieces of
// any size: the status line and headers, then the body by its framing
// (chunked, Content-Length, or to the close).
class ResponseReader {
 public:
  // One decoded piece of the body; `wire_bytes` counts what carried it on
  // the connection (a chunk's size line and CRLFs included).
  using BodyFn = std::function<void(absl::string_view piece, size_t wire_bytes)>;

  // Consumes `bytes`. InvalidArgument on a malformed head or chunk framing;
  // bytes past the end of the response are ignored.
  absl::Status Feed(absl::string_view bytes, const BodyFn& on_body);
  // The peer closed: Unavailable if the response is not complete (a body to
  // the close is complete now).
  absl::Status Close();

  bool head_done() const { return head_done_; }
  int status() const { return status_; }
  // Lower-case names.
  const std::map<std::string, std::string>& headers() const { return headers_; }
  // The whole body has arrived.
  bool complete() const { return complete_; }

 private:
  absl::Status ParseHead(absl::string_view head);

  std::string pending_;
  bool head_done_ = false, complete_ = false;
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  enum class Framing { kChunked, kSized, kToClose } framing_ = Framing::kToClose;
  int64_t left_ = 0;  // Sized: body bytes still to come.
};

struct StreamResult {
  int status = 0;
  std::string body;  // A non-200 response's body (its events are not parsed).
  bool complete = false;  // The response ended by its framing, not cut off.
};

// POSTs `body` (JSON) to `target` and passes each event's data of the
// response to `on_event` as it arrives; `on_event` returns false to stop
// reading (the connection closes). A non-200 answer comes back with its body.
// Unavailable when the connection fails or the peer closes mid-response;
// DeadlineExceeded past `timeout`.
absl::StatusOr<StreamResult> StreamPost(const std::string& host, int port, const std::string& target,
                                        const std::string& body, absl::Duration timeout,
                                        const std::function<bool(absl::string_view data)>& on_event);

}  // namespace duet::http

#endif  // DUET_HTTP_SSE_H_

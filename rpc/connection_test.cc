#include "rpc/connection.h"

#include <catch2/catch.hpp>
#include <future>
#include <mutex>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/io_thread.h"

namespace duet::rpc {
namespace {

proto::Frame Cancel(uint64_t id) {
  proto::Frame f;
  f.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  f.mutable_cancel()->set_request_id(id);
  return f;
}

// A server that echoes every frame back and records how connections ended.
struct EchoServer {
  explicit EchoServer(IoThread& io, uint32_t max_frame = kDefaultMaxFrameBytes) {
    auto s = Server::Listen(io.context(), "127.0.0.1:0", [this](ConnectionPtr c) {
      c->Start({.on_frame = [](const ConnectionPtr& c, proto::Frame f) { c->Send(f); },
                .on_close = [this](const ConnectionPtr&, const absl::Status& st) {
                  std::lock_guard<std::mutex> l(mu);
                  closes.push_back(st);
                  cv.notify_all();
                }});
    }, max_frame);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  absl::Status WaitClose(size_t n) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return closes.size() >= n; });
    return closes[n - 1];
  }
  std::unique_ptr<Server> server;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::Status> closes;
};

// A client that collects frames until it has `want`, or until closed.
struct Client {
  Client(IoThread& io, const std::string& addr) {
    auto c = Connect(io.context(), addr, absl::Seconds(5));
    REQUIRE(c.ok());
    conn = *c;
    conn->Start({.on_frame = [this](const ConnectionPtr&, proto::Frame f) {
                   std::lock_guard<std::mutex> l(mu);
                   got.push_back(std::move(f));
                   cv.notify_all();
                 },
                 .on_close = [this](const ConnectionPtr&, const absl::Status& st) {
                   std::lock_guard<std::mutex> l(mu);
                   closed = true;
                   close_status = st;
                   cv.notify_all();
                 }});
  }
  bool WaitFrames(size_t n) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return got.size() >= n || closed; });
    return got.size() >= n;
  }
  void WaitClosed() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return closed; });
  }
  ConnectionPtr conn;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::Frame> got;
  bool closed = false;
  absl::Status close_status;
};

TEST_CASE("frames round-trip in order", "[rpc]") {
  IoThread io;
  EchoServer server(io);
  Client client(io, server.server->address());
  for (uint64_t i = 0; i < 1000; ++i) client.conn->Send(Cancel(i));
  REQUIRE(client.WaitFrames(1000));
  for (uint64_t i = 0; i < 1000; ++i) REQUIRE(client.got[i].cancel().request_id() == i);
  client.conn->Close();
  client.WaitClosed();
}

TEST_CASE("a malformed frame closes only its own connection", "[rpc]") {
  IoThread io;
  EchoServer server(io);
  Client bad(io, server.server->address());
  Client good(io, server.server->address());
  // A length prefix of 5 followed by bytes that are not a protobuf Frame.
  bad.conn->SendRaw(std::string("\0\0\0\x05\xff\xff\xff\xff\xff", 9));
  bad.WaitClosed();
  REQUIRE(server.WaitClose(1).code() == absl::StatusCode::kInvalidArgument);
  good.conn->Send(Cancel(42));
  REQUIRE(good.WaitFrames(1));
  REQUIRE(good.got[0].cancel().request_id() == 42);
}

TEST_CASE("an oversized frame is refused without reading it", "[rpc]") {
  IoThread io;
  EchoServer server(io, /*max_frame=*/1024);
  Client big(io, server.server->address());
  proto::Frame f;
  f.mutable_register_()->set_model(std::string(5000, 'x'));
  big.conn->Send(f);
  big.WaitClosed();
  absl::Status st = server.WaitClose(1);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(st.message()).find("exceeds the limit") != std::string::npos);
  Client small(io, server.server->address());
  small.conn->Send(Cancel(7));
  REQUIRE(small.WaitFrames(1));
}

TEST_CASE("connecting to a closed port fails with Unavailable", "[rpc]") {
  IoThread io;
  uint16_t port;
  {
    EchoServer s(io);
    port = s.server->port();
  }
  auto c = Connect(io.context(), "127.0.0.1:" + std::to_string(port), absl::Seconds(2));
  REQUIRE(c.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(ParseHostPort("nope").status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(ParseHostPort("h:99999").status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(ParseHostPort("[::1]:80")->first == "::1");
}

}  // namespace
}  // namespace duet::rpc

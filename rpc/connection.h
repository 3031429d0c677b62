// Length-prefixed protobuf frames over Boost.Asio TCP: the transport of
// duet's control plane.
//
//   auto server = Server::Listen(io, "127.0.0.1:0", [](ConnectionPtr c) { c->Start(handlers); });
//   ASSIGN_OR_RETURN(ConnectionPtr c, Connect(io, "127.0.0.1:7000", absl::Seconds(2)));
//   c->Start({.on_frame = ..., .on_close = ...});
//   c->Send(frame);
//
// Wire format: a 4-byte big-endian length, then a serialized proto::Frame of
// that many bytes. A frame longer than the limit (default 16 MiB) or one that
// does not parse closes that connection with a log line; nothing else is
// affected. Handlers run on the io_context's thread and must not block; Send
// and Close may be called from any thread. A connection is owned by
// shared_ptr: it stays alive while reads or writes are pending.
#ifndef DUET_RPC_CONNECTION_H_
#define DUET_RPC_CONNECTION_H_

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/listen.h"  // ParseHostPort: the addresses Connect and Listen take.
#include "proto/control.pb.h"

namespace duet::rpc {

inline constexpr uint32_t kDefaultMaxFrameBytes = 16u << 20;

class Connection;
using ConnectionPtr = std::shared_ptr<Connection>;

struct ConnectionHandlers {
  std::function<void(const ConnectionPtr&, proto::Frame)> on_frame;
  // Called once, when the connection ends for any reason (peer closed, I/O
  // error, bad frame, Close()).
  std::function<void(const ConnectionPtr&, const absl::Status&)> on_close;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket socket, uint32_t max_frame_bytes);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Begins reading; handlers stay fixed afterwards.
  void Start(ConnectionHandlers handlers);
  // Queues a frame; frames go out in Send order. No-op once closed.
  void Send(const proto::Frame& frame);
  // Queues raw bytes exactly as given (tests send malformed frames this way).
  void SendRaw(std::string bytes);
  void Close();

  const std::string& peer() const { return peer_; }
  bool closed() const { return closed_.load(); }
  // Opaque slot for the owner (e.g. which worker this is).
  std::string tag;

 private:
  void ReadHeader();
  void ReadBody(uint32_t size);
  void DoWrite();
  void Fail(const absl::Status& status);

  boost::asio::ip::tcp::socket socket_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  const uint32_t max_frame_bytes_;
  std::string peer_;
  ConnectionHandlers handlers_;
  unsigned char header_[4];
  std::string body_;
  std::deque<std::string> out_;  // Only touched on the strand.
  bool writing_ = false;
  std::atomic<bool> closed_{false};
};

// Connects within `timeout`; Unavailable with the system's reason otherwise.
// Blocks the calling thread (never call it on the io_context's thread).
absl::StatusOr<ConnectionPtr> Connect(boost::asio::io_context& io, const std::string& address,
                                      absl::Duration timeout,
                                      uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

class Server {
 public:
  using AcceptHandler = std::function<void(ConnectionPtr)>;
  // Listens on HOST:PORT (port 0 picks one) and hands each accepted
  // connection to on_accept, which must Start it.
  static absl::StatusOr<std::unique_ptr<Server>> Listen(
      boost::asio::io_context& io, const std::string& address, AcceptHandler on_accept,
      uint32_t max_frame_bytes = kDefaultMaxFrameBytes);
  ~Server();

  uint16_t port() const { return port_; }
  std::string address() const;  // HOST:PORT actually bound.
  void Stop();

 private:
  Server(boost::asio::io_context& io, AcceptHandler on_accept, uint32_t max_frame_bytes);
  void Accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  AcceptHandler on_accept_;
  uint32_t max_frame_bytes_;
  std::string host_;
  uint16_t port_ = 0;
};

// Encodes a frame with its length prefix.
std::string EncodeFrame(const proto::Frame& frame);

}  // namespace duet::rpc

#endif  // DUET_RPC_CONNECTION_H_

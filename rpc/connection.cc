#include "rpc/connection.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <future>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace duet::rpc {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string EncodeFrame(const proto::Frame& frame) {
  std::string body;
  frame.SerializeToString(&body);
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string out(4, '\0');
  out[0] = static_cast<char>(n >> 24);
  out[1] = static_cast<char>(n >> 16);
  out[2] = static_cast<char>(n >> 8);
  out[3] = static_cast<char>(n);
  return out + body;
}

Connection::Connection(tcp::socket socket, uint32_t max_frame_bytes)
    : socket_(std::move(socket)),
      strand_(asio::make_strand(socket_.get_executor())),
      max_frame_bytes_(max_frame_bytes) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  peer_ = ec ? "?" : absl::StrCat(ep.address().to_string(), ":", ep.port());
  socket_.set_option(tcp::no_delay(true), ec);
}

Connection::~Connection() = default;

void Connection::Start(ConnectionHandlers handlers) {
  handlers_ = std::move(handlers);
  asio::dispatch(strand_, [self = shared_from_this()] { self->ReadHeader(); });
}

void Connection::ReadHeader() {
  asio::async_read(socket_, asio::buffer(header_, 4),
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t) {
                     if (ec) {
                       self->Fail(ec == asio::error::eof
                                      ? absl::UnavailableError("peer closed the connection")
                                      : absl::UnavailableError(ec.message()));
                       return;
                     }
                     uint32_t n = (uint32_t{self->header_[0]} << 24) | (uint32_t{self->header_[1]} << 16) |
                                  (uint32_t{self->header_[2]} << 8) | uint32_t{self->header_[3]};
                     if (n > self->max_frame_bytes_) {
                       LOG(WARNING) << "closing connection from " << self->peer_ << ": frame of " << n
                                    << " bytes exceeds the limit of " << self->max_frame_bytes_;
                       self->Fail(absl::InvalidArgumentError(
                           absl::StrCat("frame of ", n, " bytes exceeds the limit of ", self->max_frame_bytes_)));
                       return;
                     }
                     self->ReadBody(n);
                   }));
}

void Connection::ReadBody(uint32_t size) {
  body_.resize(size);
  asio::async_read(socket_, asio::buffer(body_.data(), size),
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    boost::system::error_code ec, size_t) {
                     if (ec) {
                       self->Fail(absl::UnavailableError(ec.message()));
                       return;
                     }
                     proto::Frame frame;
                     if (!frame.ParseFromString(self->body_)) {
                       LOG(WARNING) << "closing connection from " << self->peer_
                                    << ": malformed frame (" << self->body_.size() << " bytes)";
                       self->Fail(absl::InvalidArgumentError("malformed frame"));
                       return;
                     }
                     if (self->handlers_.on_frame) self->handlers_.on_frame(self, std::move(frame));
                     if (!self->closed_.load()) self->ReadHeader();
                   }));
}

void Connection::Send(const proto::Frame& frame) { SendRaw(EncodeFrame(frame)); }

void Connection::SendRaw(std::string bytes) {
  if (closed_.load()) return;
  asio::dispatch(strand_, [self = shared_from_this(), bytes = std::move(bytes)]() mutable {
    if (self->closed_.load()) return;
    self->out_.push_back(std::move(bytes));
    if (!self->writing_) self->DoWrite();
  });
}

void Connection::DoWrite() {
  writing_ = true;
  asio::async_write(socket_, asio::buffer(out_.front()),
                    asio::bind_executor(strand_, [self = shared_from_this()](
                                                     boost::system::error_code ec, size_t) {
                      self->writing_ = false;
                      // Fail() (e.g. Close() while this write was in flight)
                      // already dropped the queue: nothing left to pop.
                      if (self->closed_.load()) return;
                      if (ec) {
                        self->Fail(absl::UnavailableError(ec.message()));
                        return;
                      }
                      self->out_.pop_front();
                      if (!self->out_.empty()) self->DoWrite();
                    }));
}

void Connection::Close() {
  asio::dispatch(strand_, [self = shared_from_this()] { self->Fail(absl::CancelledError("closed")); });
}

void Connection::Fail(const absl::Status& status) {
  if (closed_.exchange(true)) return;
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  out_.clear();
  if (handlers_.on_close) handlers_.on_close(shared_from_this(), status);
  handlers_ = {};  // Break reference cycles held by the owner's lambdas.
}

absl::StatusOr<ConnectionPtr> Connect(asio::io_context& io, const std::string& address,
                                      absl::Duration timeout, uint32_t max_frame_bytes) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  // Resolve and connect on the io_context, wait here with a deadline.
  auto socket = std::make_shared<tcp::socket>(io);
  auto resolver = std::make_shared<tcp::resolver>(io);
  auto done = std::make_shared<std::promise<boost::system::error_code>>();
  auto fut = done->get_future();
  auto once = std::make_shared<std::atomic<bool>>(false);
  auto finish = [done, once](boost::system::error_code ec) {
    if (!once->exchange(true)) done->set_value(ec);
  };
  resolver->async_resolve(hp->first, std::to_string(hp->second),
                          [socket, resolver, finish](boost::system::error_code ec,
                                                     tcp::resolver::results_type results) {
                            if (ec) return finish(ec);
                            asio::async_connect(*socket, results,
                                                [finish](boost::system::error_code ec2, const tcp::endpoint&) {
                                                  finish(ec2);
                                                });
                          });
  if (fut.wait_for(absl::ToChronoMilliseconds(timeout)) != std::future_status::ready) {
    asio::post(io, [socket, resolver] {
      boost::system::error_code ec;
      resolver->cancel();
      socket->close(ec);
    });
    fut.wait();
    return absl::UnavailableError(absl::StrCat("connecting to ", address, ": timed out after ",
                                               absl::FormatDuration(timeout)));
  }
  boost::system::error_code ec = fut.get();
  if (ec) return absl::UnavailableError(absl::StrCat("connecting to ", address, ": ", ec.message()));
  return std::make_shared<Connection>(std::move(*socket), max_frame_bytes);
}

Server::Server(asio::io_context& io, AcceptHandler on_accept, uint32_t max_frame_bytes)
    : acceptor_(io), on_accept_(std::move(on_accept)), max_frame_bytes_(max_frame_bytes) {}

Server::~Server() { Stop(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Listen(asio::io_context& io, const std::string& address,
                                                       AcceptHandler on_accept, uint32_t max_frame_bytes) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  std::unique_ptr<Server> s(new Server(io, std::move(on_accept), max_frame_bytes));
  absl::Status listening = duet::Listen(s->acceptor_, address);
  if (!listening.ok()) return listening;
  s->host_ = hp->first;
  s->port_ = s->acceptor_.local_endpoint().port();
  s->Accept();
  return s;
}

std::string Server::address() const { return absl::StrCat(host_, ":", port_); }

void Server::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      LOG(WARNING) << "accept failed: " << ec.message();
    } else {
      on_accept_(std::make_shared<Connection>(std::move(socket), max_frame_bytes_));
    }
    Accept();
  });
}

void Server::Stop() {
  boost::system::error_code ec;
  acceptor_.close(ec);
}

}  // namespace duet::rpc

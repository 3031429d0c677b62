// An io_context with its own thread, for processes and tests.
//
//   IoThread io;  // running
//   auto server = Server::Listen(io.context(), "127.0.0.1:0", ...);
//
// The destructor stops the context and joins the thread.
#ifndef DUET_BASE_IO_THREAD_H_
#define DUET_BASE_IO_THREAD_H_

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <thread>

namespace duet {

class IoThread {
 public:
  IoThread() : guard_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~IoThread() { Stop(); }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  boost::asio::io_context& context() { return io_; }
  void Stop() {
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

}  // namespace duet

#endif  // DUET_BASE_IO_THREAD_H_

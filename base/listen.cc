#include "base/listen.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace duet {

absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  uint32_t port;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has a bad port"));
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

absl::Status Listen(boost::asio::ip::tcp::acceptor& acceptor, const std::string& address) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  auto hp = ParseHostPort(address.rfind(':', 0) == 0 ? "0.0.0.0" + address : address);
  if (!hp.ok()) return hp.status();
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(hp->first == "localhost" ? "127.0.0.1" : hp->first, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", address, ": ", ec.message()));
  tcp::endpoint ep(ip, hp->second);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace duet

// "HOST:PORT" addresses and the one way a server starts listening on one
// (the HTTP server and the control protocol's Server both do).
//
//   ASSIGN_OR_RETURN(auto hp, ParseHostPort("[::1]:8080"));   // {"::1", 8080}
//   RETURN_IF_ERROR(Listen(acceptor, "127.0.0.1:0"));          // then acceptor.local_endpoint()
#ifndef DUET_BASE_LISTEN_H_
#define DUET_BASE_LISTEN_H_

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet {

// Parses "HOST:PORT" (HOST a name, an IPv4 address or [IPv6]). InvalidArgument
// for no colon, an empty host or a port outside [0, 65535].
absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& address);

// Opens `acceptor` on `address` (an IP address, "localhost" for
// 127.0.0.1, or no host for every interface: ":8080"), with reuse_address,
// and listens. InvalidArgument for an address that is not one;
// Unavailable, with the system's reason, when it cannot be had.
absl::Status Listen(boost::asio::ip::tcp::acceptor& acceptor, const std::string& address);

}  // namespace duet

#endif  // DUET_BASE_LISTEN_H_

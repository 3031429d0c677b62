// Compiles Boost.Asio's TLS streams once, apart from the rest of Asio so that
// only what speaks TLS links OpenSSL.
#include <boost/asio/ssl/impl/src.hpp>

// The transport tests' own helpers: the GPU pools' pattern and where peer
// binaries are looked for.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/testing/peer_process.h"

namespace duet::kvtransfer::testing {
namespace {

TEST_CASE("the pool pattern differs between neighbours and seeds, and ranges agree with words", "[kvtransfer]") {
  CHECK(PoolWord(1, 0) != PoolWord(1, 1));
  CHECK(PoolWord(1, 0) != PoolWord(2, 0));
  std::vector<uint32_t> words = PoolWords(5, 10, 3);
  REQUIRE(words.size() == 3);
  CHECK(words[0] == PoolWord(5, 10));
  CHECK(words[2] == PoolWord(5, 12));
}

TEST_CASE("a peer binary is found through its variable, else NotFound lists where it looked", "[kvtransfer]") {
  absl::StatusOr<std::string> missing = FindPeerBinary("DUET_NO_SUCH_PEER", "kvtransfer/none/no_peer");
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()).find("DUET_NO_SUCH_PEER") != std::string::npos);
  setenv("DUET_TEST_PEER", "/bin/sh", 1);
  absl::StatusOr<std::string> found = FindPeerBinary("DUET_TEST_PEER", "kvtransfer/none/no_peer");
  REQUIRE(found.ok());
  CHECK(*found == "/bin/sh");
}

}  // namespace
}  // namespace duet::kvtransfer::testing

// The peer processes of the multi-process transport tests (and the kvtransfer
// bench), run as base/subprocess children spoken to in lines: the UCX tests'
// kvtransfer/testing/kv_peer, and where to find a peer binary in a Bazel run
// or in tools/gpu_check.sh's pack.
//
//   ASSIGN_OR_RETURN(KvPeer peer, StartKvPeer(64, 4096, /*seed=*/1));
//   ASSIGN_OR_RETURN(std::vector<uint64_t> e, PeerEpochs(*peer.process, {3, 4}));
//   ASSIGN_OR_RETURN(std::string path, FindPeerBinary("DUET_GPU_PEER", "kvtransfer/testing/gpu_peer"));
//
// Not thread-safe: one test thread drives one peer.
#ifndef DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_
#define DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/subprocess.h"

namespace duet::kvtransfer::testing {

// A running kvtransfer/testing/kv_peer (see kv_peer.cc for its commands),
// with the transport address and region descriptor it printed.
struct KvPeer {
  std::unique_ptr<Subprocess> process;
  std::string address;  // KvTransport::address() bytes
  std::string region;   // ExportRegion() bytes of its pool
};
absl::StatusOr<KvPeer> StartKvPeer(int32_t blocks, uint64_t block_bytes, uint64_t seed,
                                   const std::vector<std::string>& extra_args = {});
// The peer's current epochs of `blocks` ("epochs" command).
absl::StatusOr<std::vector<uint64_t>> PeerEpochs(Subprocess& peer, const std::vector<int32_t>& blocks);

// The peer binary: $env_var if set, else `workspace_path` (e.g.
// "kvtransfer/testing/gpu_peer") under $TEST_SRCDIR/$TEST_WORKSPACE or this
// binary's runfiles, else its basename beside this binary (the layout of
// tools/gpu_check.sh's pack). NotFound lists where it looked.
absl::StatusOr<std::string> FindPeerBinary(const std::string& env_var, const std::string& workspace_path);

}  // namespace duet::kvtransfer::testing

#endif  // DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_

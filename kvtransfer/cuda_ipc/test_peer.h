// Test support for multi-process transport tests (cuda_ipc_test, nccl_test):
// a peer process spoken to in lines over its stdin/stdout, where to find the
// peer binary in a Bazel run or in tools/gpu_check.sh's pack, and the
// deterministic pool contents both sides agree on. No CUDA in here.
//
//   ASSIGN_OR_RETURN(std::string path,
//                    FindPeerBinary("DUET_CUDA_IPC_PEER", "kvtransfer/cuda_ipc/cuda_ipc_peer"));
//   ASSIGN_OR_RETURN(auto peer, PeerProcess::Spawn(path, {"--blocks=64"}));
//   ASSIGN_OR_RETURN(std::string ready, peer->ReadLine(absl::Seconds(60)));
//
// Not thread-safe: one test thread drives one PeerProcess.
#ifndef DUET_KVTRANSFER_CUDA_IPC_TEST_PEER_H_
#define DUET_KVTRANSFER_CUDA_IPC_TEST_PEER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet::kvtransfer::gpu_testing {

class PeerProcess {
 public:
  // Starts `path args...` with pipes on stdin and stdout; stderr is inherited.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Spawn(const std::string& path,
                                                            const std::vector<std::string>& args);
  // Closes the peer's stdin (peers exit on EOF) and reaps it; SIGKILL if it
  // is still running 10 s later.
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // One line without its '\n'. DeadlineExceeded after `timeout`;
  // Unavailable when the peer closed its stdout (exited) first.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  absl::Status WriteLine(const std::string& line);
  // Closes stdin and waits up to `timeout` for the exit; returns the wait
  // status (as from waitpid). After this the pid is reaped.
  absl::StatusOr<int> CloseAndWait(absl::Duration timeout);

  pid_t pid() const { return pid_; }

 private:
  PeerProcess(pid_t pid, int to_child, int from_child)
      : pid_(pid), to_child_(to_child), from_child_(from_child) {}

  pid_t pid_;
  int to_child_;
  int from_child_;
  bool reaped_ = false;
  std::string buffer_;
};

// The peer binary: $env_var if set, else `workspace_path` (e.g.
// "kvtransfer/cuda_ipc/cuda_ipc_peer") under $TEST_SRCDIR/$TEST_WORKSPACE or
// this binary's runfiles, else its basename beside this binary (the layout of
// tools/gpu_check.sh's pack). NotFound lists where it looked.
absl::StatusOr<std::string> FindPeerBinary(const std::string& env_var,
                                           const std::string& workspace_path);

// The 32-bit word at index `word` of a pool filled with `seed`
// (a splitmix64 finaliser: every word differs from its neighbours and from
// other seeds, so a misplaced or stale block never passes for the right one).
inline uint32_t PatternWord(uint64_t seed, uint64_t word) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + word + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// Words [first_word, first_word + out.size()) of the pool.
std::vector<uint32_t> PatternWords(uint64_t seed, uint64_t first_word, size_t num_words);

}  // namespace duet::kvtransfer::gpu_testing

#endif  // DUET_KVTRANSFER_CUDA_IPC_TEST_PEER_H_

// A child process driven over its stdin/stdout, one line per message: how
// the multi-process transport tests run kvtransfer/testing/kv_peer.
//
//   ASSIGN_OR_RETURN(auto peer, PeerProcess::Start({"kvtransfer/testing/kv_peer", "--blocks=8"}));
//   peer->Send("rewrite 3"); std::string reply = peer->ReadLine().value();
//
// Reads wait on the pipe (poll) with a bound, so a dead or silent child is an
// error, never a hang. stderr is inherited. The destructor kills (SIGKILL) and
// reaps a child that is still running. Not thread-safe: one owner.
#ifndef DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_
#define DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet::kvtransfer::testing {

class PeerProcess {
 public:
  // argv[0] is the program's path; `env` entries ("NAME=value") are added to
  // (and override) this process's environment.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(
      const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  ~PeerProcess();

  absl::Status Send(const std::string& line);
  // The next line without its newline; an error at EOF or after `timeout`.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout = absl::Seconds(30));
  // Send, then ReadLine.
  absl::StatusOr<std::string> Call(const std::string& line,
                                   absl::Duration timeout = absl::Seconds(30));

  pid_t pid() const { return pid_; }
  absl::Status Signal(int sig);
  // SIGSTOP, returning once the child is stopped (waitpid WUNTRACED), and
  // SIGCONT, returning once it runs again (WCONTINUED).
  absl::Status Stop();
  absl::Status Continue();
  // Blocks until the child exits (it must be on its way: killed or told to
  // quit); returns the raw waitpid status.
  int Reap();

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

// A running kvtransfer/testing/kv_peer (see kv_peer.cc for its commands),
// with the transport address and region descriptor it printed.
struct KvPeer {
  std::unique_ptr<PeerProcess> process;
  std::string address;  // KvTransport::address() bytes
  std::string region;   // ExportRegion() bytes of its pool
};
absl::StatusOr<KvPeer> StartKvPeer(int32_t blocks, uint64_t block_bytes, uint64_t seed,
                                   const std::vector<std::string>& extra_args = {});
// The peer's current epochs of `blocks` ("epochs" command).
absl::StatusOr<std::vector<uint64_t>> PeerEpochs(PeerProcess& peer,
                                                 const std::vector<int32_t>& blocks);

}  // namespace duet::kvtransfer::testing

#endif  // DUET_KVTRANSFER_TESTING_PEER_PROCESS_H_

// Linux network namespaces joined by veth links, for tests and benchmarks
// whose traffic must cross a real interface: one namespace per node, each
// with an eth0 paired with a port of a bridge in a hub namespace, an address
// from 198.18.0.0/15 (the range set aside for benchmarking networks) and no
// route out. Everything is removed, interfaces included, when the Netns goes.
// Needs root (ip netns).
//
//   ASSIGN_OR_RETURN(auto net, Netns::Create({"exporter", "importer"}));
//   RETURN_IF_ERROR(net->Enter("importer"));  // this thread, and what it starts
//   Subprocess::Start(net->Wrap("exporter", {"kv_peer", ...}));
//
// Not thread-safe: one owner. Enter moves only the calling thread.
#ifndef DUET_BASE_NETNS_H_
#define DUET_BASE_NETNS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet {

class Netns {
 public:
  // Namespaces for `nodes` (names made of letters, digits and '-'), with
  // addresses 198.18.0.1, .2, ... in their order.
  static absl::StatusOr<std::unique_ptr<Netns>> Create(const std::vector<std::string>& nodes);
  // Moves the thread that created it back to its namespace (when it is the
  // one destroying it) and deletes the namespaces; a failure is only
  // reported on stderr.
  ~Netns();
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  // The namespace's name as `ip netns` knows it.
  std::string Name(const std::string& node) const { return prefix_ + node; }
  const std::string& address(const std::string& node) const { return addresses_.at(node); }
  // The interface in the hub's namespace that `node`'s eth0 is paired with.
  const std::string& HubEnd(const std::string& node) const { return hub_ends_.at(node); }
  // `argv` run inside `node`'s namespace (ip netns exec, which execs it:
  // the child's pid is the command's).
  std::vector<std::string> Wrap(const std::string& node, const std::vector<std::string>& argv) const;
  // Moves the calling thread (and the processes it starts) into `node`'s
  // namespace, or back to the one it was created in for "".
  absl::Status Enter(const std::string& node);
  // eth0's transmitted bytes in `node`'s namespace.
  absl::StatusOr<int64_t> TxBytes(const std::string& node) const;

 private:
  Netns() = default;
  std::string prefix_;
  int original_ = -1;
  std::vector<std::string> created_;  // namespaces to delete, in order
  std::map<std::string, std::string> addresses_, hub_ends_;
};

// Runs `tool ARGS...` (ip, tc) to its end: its stdout, or an error naming the
// command unless it exits 0.
absl::StatusOr<std::string> RunTool(const std::string& tool, const std::vector<std::string>& args);

}  // namespace duet

#endif  // DUET_BASE_NETNS_H_

#include "base/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "nlohmann/json.hpp"

namespace duet {

absl::StatusOr<std::string> RunTool(const std::string& tool, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {tool};
  argv.insert(argv.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv, absl::Seconds(30)));
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " failed (status ", r.status, ")"));
  }
  return r.output;
}

absl::StatusOr<std::unique_ptr<Netns>> Netns::Create(const std::vector<std::string>& nodes) {
  std::unique_ptr<Netns> net(new Netns());
  net->prefix_ = absl::StrCat("duet", getpid(), "-");
  net->original_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (net->original_ < 0) return absl::InternalError(absl::StrCat("/proc/self/ns/net: ", std::strerror(errno)));
  const std::string hub = net->Name("hub");
  auto ip = [](const std::vector<std::string>& args) { return RunTool("ip", args).status(); };
  RETURN_IF_ERROR(ip({"netns", "add", hub}));
  net->created_.push_back(hub);
  RETURN_IF_ERROR(ip({"-n", hub, "link", "add", "br0", "type", "bridge"}));
  RETURN_IF_ERROR(ip({"-n", hub, "link", "set", "br0", "up"}));
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string ns = net->Name(nodes[i]), hub_end = absl::StrCat("v", i);
    const std::string address = absl::StrCat("198.18.0.", i + 1);
    RETURN_IF_ERROR(ip({"netns", "add", ns}));
    net->created_.push_back(ns);
    RETURN_IF_ERROR(ip({"-n", hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0", "netns", ns}));
    RETURN_IF_ERROR(ip({"-n", hub, "link", "set", hub_end, "master", "br0", "up"}));
    RETURN_IF_ERROR(ip({"-n", ns, "addr", "add", address + "/24", "dev", "eth0"}));
    RETURN_IF_ERROR(ip({"-n", ns, "link", "set", "eth0", "up"}));
    RETURN_IF_ERROR(ip({"-n", ns, "link", "set", "lo", "up"}));
    net->addresses_[nodes[i]] = address;
    net->hub_ends_[nodes[i]] = hub_end;
  }
  return net;
}

Netns::~Netns() {
  if (original_ >= 0) {
    setns(original_, CLONE_NEWNET);
    close(original_);
  }
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    if (absl::Status s = RunTool("ip", {"netns", "del", *it}).status(); !s.ok()) {
      std::cerr << "could not delete network namespace " << *it << ": " << s << "\n";
    }
  }
}

std::vector<std::string> Netns::Wrap(const std::string& node, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"ip", "netns", "exec", Name(node)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status Netns::Enter(const std::string& node) {
  int fd = original_;
  if (!node.empty()) {
    fd = open(("/run/netns/" + Name(node)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("network namespace ", Name(node), ": ", std::strerror(errno)));
  }
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  if (fd != original_) close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("setns into ", node, ": ", std::strerror(err)));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Netns::TxBytes(const std::string& node) const {
  ASSIGN_OR_RETURN(std::string out, RunTool("ip", {"-n", Name(node), "-s", "-j", "link", "show", "eth0"}));
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json::json_pointer bytes("/0/stats64/tx/bytes");
  if (j.is_discarded() || !j.contains(bytes) || !j[bytes].is_number_integer()) {
    return absl::InternalError(absl::StrCat("ip -s -j link show eth0 in ", Name(node), ": no tx bytes in ", out));
  }
  return j[bytes].get<int64_t>();
}

}  // namespace duet

#include "kvtransfer/testing/peer_process.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace duet::kvtransfer::testing {
namespace {

bool Executable(const std::string& path) { return !path.empty() && access(path.c_str(), X_OK) == 0; }

std::string SelfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

absl::StatusOr<KvPeer> StartKvPeer(int32_t blocks, uint64_t block_bytes, uint64_t seed,
                                   const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {"kvtransfer/testing/kv_peer",
                                   absl::StrCat("--blocks=", blocks),
                                   absl::StrCat("--block-bytes=", block_bytes),
                                   absl::StrCat("--seed=", seed)};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto process = Subprocess::StartWithPipes(argv);
  if (!process.ok()) return process.status();
  KvPeer peer;
  peer.process = std::move(*process);
  for (const char* key : {"address", "region", "ready"}) {
    auto line = peer.process->ReadLine();
    if (!line.ok()) return line.status();
    std::string prefix = std::string(key);
    if (line->compare(0, prefix.size(), prefix) != 0) {
      return absl::InternalError(absl::StrCat("kv_peer: expected ", key, ", got: ", *line));
    }
    std::string hex = line->size() > prefix.size() ? line->substr(prefix.size() + 1) : "";
    if (prefix == "address") peer.address = absl::HexStringToBytes(hex);
    if (prefix == "region") peer.region = absl::HexStringToBytes(hex);
  }
  return peer;
}

absl::StatusOr<std::vector<uint64_t>> PeerEpochs(Subprocess& peer, const std::vector<int32_t>& blocks) {
  std::string cmd = "epochs";
  for (int32_t b : blocks) absl::StrAppend(&cmd, " ", b);
  auto line = peer.Call(cmd);
  if (!line.ok()) return line.status();
  std::vector<std::string> words = absl::StrSplit(*line, ' ');
  if (words.size() != blocks.size() + 1 || words[0] != "epochs") {
    return absl::InternalError(absl::StrCat("kv_peer: bad epochs reply: ", *line));
  }
  std::vector<uint64_t> epochs;
  for (size_t i = 1; i < words.size(); ++i) {
    uint64_t e;
    if (!absl::SimpleAtoi(words[i], &e)) return absl::InternalError("kv_peer: bad epoch");
    epochs.push_back(e);
  }
  return epochs;
}

absl::StatusOr<std::string> FindPeerBinary(const std::string& env_var,
                                           const std::string& workspace_path) {
  std::vector<std::string> tried;
  auto try_path = [&](const std::string& p) {
    tried.push_back(p);
    return Executable(p);
  };
  if (const char* env = std::getenv(env_var.c_str()); env != nullptr && *env != '\0') {
    if (try_path(env)) return std::string(env);
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    std::string p =
        absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "duet", "/", workspace_path);
    if (try_path(p)) return p;
  }
  std::string self = SelfPath();
  if (!self.empty()) {
    std::string p = absl::StrCat(self, ".runfiles/duet/", workspace_path);
    if (try_path(p)) return p;
    std::string dir = self.substr(0, self.rfind('/'));
    std::string base = workspace_path.substr(workspace_path.rfind('/') + 1);
    p = absl::StrCat(dir, "/", base);
    if (try_path(p)) return p;
  }
  return absl::NotFoundError(absl::StrCat("peer binary ", workspace_path, " not found; tried: ",
                                          absl::StrJoin(tried, ", "), " (set ", env_var, ")"));
}

}  // namespace duet::kvtransfer::testing

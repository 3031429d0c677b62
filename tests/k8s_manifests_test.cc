// deploy/kubernetes/ against the Kubernetes API schemas and against duet
// itself: engine/testing/npm/k8s_manifests_check.js validates every document
// (the pinned kubernetes-models package) and cross-checks selectors, probe
// and scrape ports, the Services and the grace period, then lists each
// container's arguments; this test hands every list to the real binary's
// flag parser (with --help, so nothing starts), which must accept it, and
// one with a flag duet lacks, which it must refuse. Needs node and
// `bash tools/setup.sh`.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/subprocess.h"
#include "engine/testing/tokenizer_node.h"

namespace duet::testing {
namespace {

constexpr char kScript[] = "engine/testing/npm/k8s_manifests_check.js";

int RunDuet(std::vector<std::string> args) {
  args.insert(args.begin(), std::filesystem::absolute("tools/duet").string());
  auto r = RunCommand(args, absl::Seconds(60));
  REQUIRE(r.ok());
  INFO(absl::StrJoin(args, " "));
  return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

TEST_CASE("the Kubernetes manifests pass the API schemas, hang together, and duet accepts their arguments") {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  REQUIRE(modules.ok());
  absl::StatusOr<std::string> out = RunNodeScript(kScript, {"deploy/kubernetes"}, *modules);
  if (!out.ok()) FAIL(out.status().ToString());
  const nlohmann::json j = nlohmann::json::parse(*out, nullptr, false);
  REQUIRE(j.is_object());
  const auto& containers = j["containers"];
  std::vector<std::string> names;
  for (const auto& c : containers) names.push_back(c["container"].get<std::string>());
  CHECK(names == std::vector<std::string>{"decode", "planner", "prefill", "router"});  // By file name.
  for (const auto& c : containers) {
    INFO(c["file"].get<std::string>() << " " << c["container"].get<std::string>());
    std::vector<std::string> args = c["args"].get<std::vector<std::string>>();
    REQUIRE(!args.empty());
    args.push_back("--help");
    CHECK(RunDuet(args) == 0);
    args.insert(args.end() - 1, "--no-such-flag");
    CHECK(RunDuet(args) == 2);
  }
}

}  // namespace
}  // namespace duet::testing

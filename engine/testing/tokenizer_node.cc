#include "engine/testing/tokenizer_node.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/subprocess.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kSetupHint[] =
    "install them with `bash tools/setup.sh` in the checkout (or point DUET_NODE_MODULES at a "
    "node_modules folder holding the packages of engine/testing/npm/package.json)";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every package of engine/testing/npm/package.json present at its pinned version.
absl::Status CheckPinned(const fs::path& modules) {
  if (!fs::is_directory(modules)) {
    return absl::FailedPreconditionError(
        absl::StrCat("npm packages folder ", modules.string(), " does not exist: ", kSetupHint));
  }
  const fs::path pins = "engine/testing/npm/package.json";  // In the runfiles, when a target lists it.
  if (!fs::exists(pins)) return absl::OkStatus();
  auto want = nlohmann::json::parse(ReadAll(pins), nullptr, /*allow_exceptions=*/false);
  if (want.is_discarded() || !want.contains("dependencies")) {
    return absl::InternalError("engine/testing/npm/package.json has no \"dependencies\"");
  }
  for (const auto& [name, version] : want["dependencies"].items()) {
    fs::path manifest = modules / name / "package.json";
    auto got = nlohmann::json::parse(ReadAll(manifest), nullptr, false);
    if (got.is_discarded() || !got.contains("version")) {
      return absl::FailedPreconditionError(
          absl::StrCat("npm package ", name, " is not installed in ", modules.string(), ": ", kSetupHint));
    }
    if (got["version"] != version) {
      return absl::FailedPreconditionError(
          absl::StrCat("npm package ", name, " in ", modules.string(), " is version ", got["version"].dump(),
                       ", engine/testing/npm/package.json pins ", version.dump(), ": ", kSetupHint));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> FindNodeModules(const std::string& runfile) {
  if (const char* env = std::getenv("DUET_NODE_MODULES"); env != nullptr && *env != '\0') {
    absl::Status s = CheckPinned(env);
    if (!s.ok()) return absl::FailedPreconditionError(absl::StrCat("$DUET_NODE_MODULES: ", s.message()));
    return std::string(env);
  }
  const fs::path rel = fs::path(".deps") / "node" / "node_modules";
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"); ws != nullptr && *ws != '\0') {
    fs::path modules = fs::path(ws) / rel;
    if (absl::Status s = CheckPinned(modules); !s.ok()) return s;
    return modules.string();
  }
  std::error_code ec;
  fs::path real = fs::canonical(runfile, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot find the pinned npm packages: $DUET_NODE_MODULES is not set and ", runfile,
        " (a runfile, used to find the checkout) does not resolve: ", ec.message(), "; ", kSetupHint));
  }
  for (fs::path dir = real.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_directory(dir / rel)) {
      fs::path modules = dir / rel;
      if (absl::Status s = CheckPinned(modules); !s.ok()) return s;
      return modules.string();
    }
    if (dir == dir.root_path()) break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot find .deps/node/node_modules above ", real.string(), ": ", kSetupHint));
}

absl::StatusOr<std::string> FindNode() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');) {
      if (!d.empty()) dirs.push_back(d);
    }
  }
  dirs.push_back("/usr/bin");
  dirs.push_back("/usr/local/bin");
  for (const std::string& d : dirs) {
    std::string candidate = d + "/node";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::FailedPreconditionError(
      "cannot find `node` on $PATH, /usr/bin or /usr/local/bin: install Node.js 20+ "
      "(and the pinned npm packages with `bash tools/setup.sh`)");
}

absl::StatusOr<std::string> RunNodeScript(const std::string& script, const std::vector<std::string>& args,
                                          const std::string& node_modules) {
  absl::StatusOr<std::string> node = FindNode();
  if (!node.ok()) return node.status();
  if (!fs::exists(script)) return absl::NotFoundError(absl::StrCat("script ", script, " not found"));

  std::vector<std::string> argv = {*node, script};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<CommandResult> r = RunCommand(argv, absl::Minutes(10), {"DUET_NODE_MODULES=" + node_modules});
  if (!r.ok()) return r.status();
  const int status = r->status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("`node ", script, "` failed (", WIFEXITED(status) ? "exit status " : "signal ",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), "); its stderr is above"));
  }
  return std::move(r->output);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ParseIdLines(std::string_view text) {
  std::vector<std::vector<int32_t>> lines;
  while (!text.empty()) {
    size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    auto fail = [&] {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", lines.size() + 1, " is not [id, ...]: ", std::string(line.substr(0, 80))));
    };
    if (line.size() < 2 || line.front() != '[' || line.back() != ']') return fail();
    std::vector<int32_t> ids;
    // Digits separated by single commas, no trailing comma ("undefined" from
    // JavaScript prints as an empty element).
    std::string_view rest = line.substr(1, line.size() - 2);
    while (!rest.empty()) {
      int64_t v = 0;
      size_t i = 0;
      while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9' && v <= INT32_MAX)
        v = v * 10 + (rest[i++] - '0');
      if (i == 0 || v > INT32_MAX) return fail();
      ids.push_back(static_cast<int32_t>(v));
      if (i == rest.size()) break;
      if (rest[i] != ',' || i + 1 == rest.size()) return fail();
      rest.remove_prefix(i + 1);
    }
    lines.push_back(std::move(ids));
  }
  return lines;
}

}  // namespace duet::testing

// Runs the JavaScript tokenizers that duet's tokenizer is checked and
// benchmarked against: finds node and the pinned npm packages that
// tools/setup.sh installs into .deps/node, and runs the scripts in engine/testing/npm.
//
//   ASSIGN_OR_RETURN(std::string modules, FindNodeModules("engine/testing/npm/encode_gpt2.js"));
//   ASSIGN_OR_RETURN(std::string out, RunNodeScript("engine/testing/npm/encode_gpt2.js", {corpus}, modules));
//
// Used by the parity tests in tests/ and by //tools/bench:tokenizer. Neither
// node nor the packages are Bazel inputs: a missing one is an error naming
// tools/setup.sh (a parity test must fail, never skip, without them).
#ifndef DUET_ENGINE_TESTING_TOKENIZER_NODE_H_
#define DUET_ENGINE_TESTING_TOKENIZER_NODE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::testing {

// The node_modules folder with the packages pinned in engine/testing/npm/package.json:
// $DUET_NODE_MODULES if set, else .deps/node/node_modules in the checkout:
// $BUILD_WORKSPACE_DIRECTORY's (bazel run), else the first one found walking
// up from the real path of `runfile` (a source file in the runfiles, which
// Bazel links to the checkout). Checks that every pinned package is installed
// at its pinned version when engine/testing/npm/package.json is in the runfiles.
// FailedPrecondition naming tools/setup.sh otherwise.
absl::StatusOr<std::string> FindNodeModules(const std::string& runfile);

// The node executable on $PATH (or /usr/bin, /usr/local/bin).
absl::StatusOr<std::string> FindNode();

// Runs `node script args...` with DUET_NODE_MODULES=node_modules and returns
// what it printed on stdout; its stderr goes to ours. Internal error, with
// the exit status, when it does not exit 0.
absl::StatusOr<std::string> RunNodeScript(const std::string& script, const std::vector<std::string>& args,
                                          const std::string& node_modules);

// Parses one JSON array of integers per line (what engine/testing/npm/encode_*.js print).
absl::StatusOr<std::vector<std::vector<int32_t>>> ParseIdLines(std::string_view text);

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_TOKENIZER_NODE_H_

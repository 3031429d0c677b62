// The package layering check: which top-level package may depend on which,
// read from the list in the top-level README, checked against every
// `#include "pkg/..."` and every `//pkg...` label in the tree's sources and
// BUILD files.
//
//   ASSIGN_OR_RETURN(LayerRules rules, ParseLayerRules(readme_text));
//   for (const Violation& v : CheckTree(checkout_root, rules)) std::cerr << v.ToString() << "\n";
//
// The list is the fenced block after the line `<!-- layers -->`: one line per
// package, `name -> dep dep ...`. What a package may use is what it names
// and, transitively, what those may use; an entry with a colon
// (`tools:duet`) allows that one Bazel target and nothing below it. Labels in
// visibility lists (`__pkg__`, `__subpackages__`) name who may see a target,
// not what it uses, and are not dependencies. Entries after a `|` are for
// the package's test code only: its *_test sources, and the rules of its
// BUILD files that are tests, test libraries or testonly (with the files
// they name, unless another rule names them too).
#ifndef DUET_TESTS_LAYERING_H_
#define DUET_TESTS_LAYERING_H_

#include <map>
#include <set>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace duet::testing {

struct LayerRules {
  // Package -> the packages (closed transitively) and single targets it may use.
  std::map<std::string, std::set<std::string>> allowed;
  // The same with the entries after `|`: what its test code may use.
  std::map<std::string, std::set<std::string>> test_allowed;
};

// InvalidArgument when there is no `<!-- layers -->` block, a line lacks
// its "->" or has two "|", a package is listed twice, or a dependency is not listed itself.
absl::StatusOr<LayerRules> ParseLayerRules(absl::string_view readme);

struct Violation {
  std::string file;  // Relative to the root.
  int line = 0;
  std::string from;  // The file's package.
  std::string to;    // The package (or target) it reaches.
  std::string ToString() const;
};

// Every arrow in the tree under `root` that `rules` do not allow, in file
// order; also a top-level folder with a BUILD file that the list lacks (line
// 0). Folders named bazel-* or starting with a dot are not looked at.
std::vector<Violation> CheckTree(const std::string& root, const LayerRules& rules);

}  // namespace duet::testing

#endif  // DUET_TESTS_LAYERING_H_

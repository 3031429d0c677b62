#include "tests/layering.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace duet::testing {
namespace fs = std::filesystem;
namespace {

constexpr absl::string_view kMarker = "<!-- layers -->";

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lines of the first fenced block after the marker.
absl::StatusOr<std::vector<std::string>> BlockLines(absl::string_view text) {
  const size_t marker = text.find(kMarker);
  if (marker == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("no ", kMarker, " block"));
  }
  const size_t open = text.find("```", marker);
  if (open == absl::string_view::npos) return absl::InvalidArgumentError("the layers block has no ``` fence");
  const size_t body = text.find('\n', open);
  const size_t close = text.find("```", body == absl::string_view::npos ? open + 3 : body);
  if (body == absl::string_view::npos || close == absl::string_view::npos) {
    return absl::InvalidArgumentError("the layers block is not closed");
  }
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(text.substr(body + 1, close - body - 1), '\n')) {
    l = absl::StripAsciiWhitespace(l);
    if (!l.empty() && l[0] != '#') lines.emplace_back(l);
  }
  return lines;
}

std::string TopOf(const std::string& path) { return path.substr(0, path.find('/')); }

// The closure of each package's direct entries over `direct`.
std::map<std::string, std::set<std::string>> Close(const std::map<std::string, std::vector<std::string>>& direct,
                                                   const std::map<std::string, std::vector<std::string>>& extra) {
  std::map<std::string, std::set<std::string>> closed;
  for (const auto& [name, deps] : direct) {
    std::set<std::string>& out = closed[name];
    std::vector<std::string> todo(deps.begin(), deps.end());
    auto e = extra.find(name);
    if (e != extra.end()) todo.insert(todo.end(), e->second.begin(), e->second.end());
    while (!todo.empty()) {
      std::string d = todo.back();
      todo.pop_back();
      if (!out.insert(d).second || d.find(':') != std::string::npos) continue;
      const std::vector<std::string>& next = direct.at(d);
      todo.insert(todo.end(), next.begin(), next.end());
    }
  }
  return closed;
}

// A BUILD file's rules, each as its first and last line (1-based) and
// whether it is test code: a *_test or *_test_library rule, or one marked
// testonly.
struct Rule {
  int first = 0;
  int last = 0;
  bool test = false;
  std::vector<std::string> files;  // Its srcs and hdrs, relative to the BUILD file's folder.
};

std::vector<Rule> RulesOf(const std::string& build) {
  static const std::regex kStart(R"re(^([A-Za-z_]+)\()re");
  static const std::regex kFile(R"re("([^"/:][^":]*\.(h|cc|cu|cuh))")re");
  std::vector<Rule> rules;
  bool open = false;
  std::istringstream text(build);
  std::string line;
  for (int n = 1; std::getline(text, line); ++n) {
    std::smatch m;
    if (std::regex_search(line, m, kStart)) {
      const std::string kind = m[1].str();
      rules.push_back({.first = n, .last = n, .test = absl::EndsWith(kind, "_test") || absl::EndsWith(kind, "_test_library")});
      open = true;
    }
    if (!open) continue;
    Rule& r = rules.back();
    r.last = n;
    if (line.find("testonly = True") != std::string::npos) r.test = true;
    for (auto i = std::sregex_iterator(line.begin(), line.end(), kFile); i != std::sregex_iterator(); ++i) {
      r.files.push_back((*i)[1].str());
    }
    if (absl::StartsWith(line, ")")) open = false;
  }
  return rules;
}

}  // namespace

absl::StatusOr<LayerRules> ParseLayerRules(absl::string_view readme) {
  std::vector<std::string> lines;
  {
    auto l = BlockLines(readme);
    if (!l.ok()) return l.status();
    lines = std::move(*l);
  }
  std::map<std::string, std::vector<std::string>> direct;
  std::map<std::string, std::vector<std::string>> test_only;
  for (const std::string& line : lines) {
    const size_t arrow = line.find("->");
    if (arrow == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("no \"->\" in \"", line, "\""));
    std::string name(absl::StripAsciiWhitespace(line.substr(0, arrow)));
    if (name.empty() || !direct.emplace(name, std::vector<std::string>{}).second) {
      return absl::InvalidArgumentError(absl::StrCat("package \"", name, "\" is empty or listed twice"));
    }
    const std::vector<std::string> sides = absl::StrSplit(line.substr(arrow + 2), '|');
    if (sides.size() > 2) return absl::InvalidArgumentError(absl::StrCat("more than one \"|\" in \"", line, "\""));
    for (size_t side = 0; side < sides.size(); ++side) {
      for (absl::string_view d : absl::StrSplit(sides[side], ' ', absl::SkipEmpty())) {
        (side == 0 ? direct[name] : test_only[name]).emplace_back(d);
      }
    }
  }
  for (const auto* entries : {&direct, &test_only}) {
    for (const auto& [name, deps] : *entries) {
      for (const std::string& d : deps) {
        if (!direct.count(d.substr(0, d.find(':')))) {
          return absl::InvalidArgumentError(absl::StrCat(name, " -> ", d, ": ", d, " is not listed"));
        }
      }
    }
  }
  LayerRules rules;
  rules.allowed = Close(direct, {});
  rules.test_allowed = Close(direct, test_only);
  return rules;
}

std::string Violation::ToString() const {
  if (line == 0) return absl::StrCat(file, ": package ", from, " is not in the README's layers list");
  return absl::StrCat(file, ":", line, ": ", from, " may not depend on ", to);
}

std::vector<Violation> CheckTree(const std::string& root, const LayerRules& rules) {
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([A-Za-z0-9_]+)/([^"]*)")re");
  // A label in quotes: //pkg..., its target after the colon (visibility
  // labels end in __pkg__ or __subpackages__).
  static const std::regex kLabel(R"re("//([A-Za-z0-9_]+)([^":]*)(:([^"]*))?")re");
  std::vector<Violation> out;
  std::vector<fs::path> files;
  std::set<std::string> tops;
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("bazel-", 0) == 0 || name[0] == '.') continue;
    if (!fs::exists(e.path() / "BUILD")) continue;
    tops.insert(name);
    if (!rules.allowed.count(name)) out.push_back({.file = name + "/BUILD", .line = 0, .from = name});
    for (const fs::directory_entry& f : fs::recursive_directory_iterator(e.path())) {
      if (f.is_regular_file()) files.push_back(f.path());
    }
  }
  std::sort(files.begin(), files.end());
  // Which sources are test code: *_test.cc, or named by a test rule of the
  // BUILD file in their folder and by none of its other rules.
  std::set<fs::path> test_files, production_files;
  std::map<fs::path, std::vector<Rule>> build_rules;
  for (const fs::path& p : files) {
    if (p.filename() != "BUILD") continue;
    std::vector<Rule>& rs = build_rules[p] = RulesOf(ReadFile(p));
    for (const Rule& r : rs) {
      for (const std::string& f : r.files) (r.test ? test_files : production_files).insert(p.parent_path() / f);
    }
  }
  for (const fs::path& f : production_files) test_files.erase(f);
  for (const fs::path& p : files) {
    const std::string rel = fs::relative(p, root).string();
    const std::string from = TopOf(rel);
    auto it = rules.allowed.find(from);
    if (it == rules.allowed.end()) continue;
    const std::set<std::string>& production = it->second;
    const std::set<std::string>& test = rules.test_allowed.at(from);
    const std::string ext = p.extension().string();
    const bool source = ext == ".h" || ext == ".cc" || ext == ".cu" || ext == ".cuh";
    const bool build = p.filename() == "BUILD" || ext == ".bzl";
    if (!source && !build) continue;
    const bool test_source = source && (absl::EndsWith(p.stem().string(), "_test") || test_files.count(p));
    const std::vector<Rule>* rs = build ? &build_rules[p] : nullptr;
    std::istringstream text(ReadFile(p));
    std::string line;
    for (int n = 1; std::getline(text, line); ++n) {
      bool in_test = test_source;
      if (rs != nullptr) {
        for (const Rule& r : *rs) in_test = in_test || (r.test && r.first <= n && n <= r.last);
      }
      const std::set<std::string>& allowed = in_test ? test : production;
      auto reject = [&](const std::string& to, const std::string& target) {
        if (!tops.count(to) || to == from || allowed.count(to)) return;
        if (!target.empty() && allowed.count(absl::StrCat(to, ":", target))) return;
        out.push_back({.file = rel, .line = n, .from = from, .to = target.empty() ? to : absl::StrCat(to, ":", target)});
      };
      std::smatch m;
      if (source) {
        if (std::regex_search(line, m, kInclude)) {
          // A header directly in a package is its target's of the same stem
          // (one library per header): `kernels/rope.h` is kernels:rope.
          const std::string rest = m[2].str();
          const bool direct = rest.find('/') == std::string::npos;
          if (!direct || !allowed.count(absl::StrCat(m[1].str(), ":", rest.substr(0, rest.rfind('.'))))) {
            reject(m[1].str(), "");
          }
        }
        continue;
      }
      for (auto i = std::sregex_iterator(line.begin(), line.end(), kLabel); i != std::sregex_iterator(); ++i) {
        const std::string target = (*i)[4].str();
        if (target == "__pkg__" || target == "__subpackages__") continue;
        // A target of the top package itself (//tools:duet) keeps its name;
        // one of a subpackage (//tools/bench:x) is that package's.
        reject((*i)[1].str(), (*i)[2].str().empty() ? target : "");
      }
    }
  }
  return out;
}

}  // namespace duet::testing

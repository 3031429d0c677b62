// The layering check: on small trees it builds itself (each breaking one
// rule), then on the checkout the test runs from, whose README holds the list.
#include "tests/layering.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace duet::testing {
namespace {
namespace fs = std::filesystem;

constexpr char kReadme[] = R"(# a project
<!-- layers -->
```
base    ->
engine  -> base
tests   -> engine tools:duet
decode  -> engine
router  -> engine
prefill -> engine
tools   -> decode prefill router
```
)";

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A tree that keeps every rule; each test then breaks one.
fs::path CleanTree(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path root = fs::path(tmp != nullptr ? tmp : "/tmp") / name;
  fs::remove_all(root);
  Write(root / "README.md", kReadme);
  for (const char* pkg : {"base", "engine", "decode", "router", "prefill", "tools", "tests"}) {
    Write(root / pkg / "BUILD", "package(default_visibility = [\"//tests:__pkg__\"])\n");
  }
  Write(root / "engine/model.h", "#include \"base/status.h\"\n#include <vector>\n#include \"absl/status/status.h\"\n");
  Write(root / "decode/BUILD", "cc_library(name = \"d\", deps = [\"//engine:model\", \"//base:log\", \"@rules_cc//cc:defs\"])\n");
  Write(root / "router/router.cc", "#include \"router/router.h\"\n#include \"engine/model.h\"\n");
  Write(root / "tools/duet.cc", "#include \"decode/d.h\"\n#include \"router/router.h\"\n");
  Write(root / "tests/BUILD", "cc_test(name = \"t\", data = [\"//tools:duet\"], deps = [\"//engine/testing:tiny\"])\n");
  Write(root / "bazel-out/x.cc", "#include \"tools/duet.h\"\n");  // Never looked at.
  return root;
}

std::vector<Violation> Check(const fs::path& root) {
  std::ifstream in(root / "README.md");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto rules = ParseLayerRules(text);
  REQUIRE(rules.ok());
  return CheckTree(root.string(), *rules);
}

// The violations' ToString()s, joined by `sep`.
std::string Joined(const std::vector<Violation>& v, const char* sep = "|") {
  std::vector<std::string> s;
  for (const Violation& x : v) s.push_back(x.ToString());
  return absl::StrJoin(s, sep);
}

// kReadme with router's line changed to `router_line`, written to root's
// README.md; returns the text.
std::string WriteRouterRule(const fs::path& root, const std::string& router_line) {
  std::string readme = kReadme;
  readme.replace(readme.find("router  -> engine"), 17, router_line);
  Write(root / "README.md", readme);
  return readme;
}

TEST_CASE("the rules are closed transitively, and a target entry allows that target only") {
  auto rules = ParseLayerRules(kReadme);
  REQUIRE(rules.ok());
  CHECK(rules->allowed["tools"] == std::set<std::string>{"base", "decode", "engine", "prefill", "router"});
  CHECK(rules->allowed["tests"] == std::set<std::string>{"base", "engine", "tools:duet"});
  CHECK(rules->allowed["base"].empty());
}

TEST_CASE("a tree that keeps the rules has no violation") {
  std::vector<Violation> v = Check(CleanTree("clean"));
  INFO(v.size() << " violations, first " << (v.empty() ? "" : v[0].ToString()));
  CHECK(v.empty());
}

TEST_CASE("(a) a tools/ include in router/ is a violation") {
  fs::path root = CleanTree("a");
  Write(root / "router/api.h", "// x\n#include \"engine/model.h\"\n  #include \"tools/model_maker.h\"\n");
  std::vector<Violation> v = Check(root);
  REQUIRE(v.size() == 1);
  CHECK(v[0].file == "router/api.h");
  CHECK(v[0].line == 3);
  CHECK(v[0].from == "router");
  CHECK(v[0].to == "tools");
}

TEST_CASE("(b) a //tests dependency in decode/ is a violation") {
  fs::path root = CleanTree("b");
  Write(root / "decode/BUILD",
        "cc_test(\n    name = \"t\",\n    deps = [\"//engine:model\", \"//tests:test_models\"],\n)\n");
  std::vector<Violation> v = Check(root);
  REQUIRE(v.size() == 1);
  CHECK(v[0].file == "decode/BUILD");
  CHECK(v[0].line == 3);
  CHECK(v[0].to == "tests:test_models");
  // Naming decode/ in a visibility list is not a dependency of tests/ on it.
  Write(root / "decode/BUILD", "package(default_visibility = [\"//tests:__pkg__\", \"//tests:__subpackages__\"])\n");
  CHECK(Check(root).empty());
}

TEST_CASE("(c) a prefill/ include in engine/ is a violation") {
  fs::path root = CleanTree("c");
  Write(root / "engine/sub/gen.cc", "#include \"prefill/request.h\"\n");
  std::vector<Violation> v = Check(root);
  REQUIRE(v.size() == 1);
  CHECK(v[0].ToString() == "engine/sub/gen.cc:1: engine may not depend on prefill");
}

TEST_CASE("a target entry allows no other target of its package, and an unlisted package is named") {
  fs::path root = CleanTree("d");
  Write(root / "tests/BUILD", "cc_test(name = \"t\", data = [\"//tools:duet\", \"//tools:cluster_config\"])\n");
  Write(root / "kvcache/BUILD", "\n");
  CHECK(Joined(Check(root)) ==
        "kvcache/BUILD: package kvcache is not in the README's layers list|"
        "tests/BUILD:1: tests may not depend on tools:cluster_config");
}

TEST_CASE("a target entry allows its own header and no other of its package") {
  fs::path root = CleanTree("e");
  WriteRouterRule(root, "router  -> engine tools:duet");
  Write(root / "router/x.cc", "#include \"tools/duet.h\"\n#include \"tools/other.h\"\n#include \"tools/sub/duet.h\"\n");
  CHECK(Joined(Check(root)) ==
        "router/x.cc:2: router may not depend on tools|router/x.cc:3: router may not depend on tools");
}

TEST_CASE("entries after | are for test code only: *_test sources, test, test library and testonly rules and their "
          "files") {
  fs::path root = CleanTree("f");
  const std::string readme = WriteRouterRule(root, "router  -> base | engine");
  fs::remove(root / "router/router.cc");
  Write(root / "router/BUILD",
        "cc_library(\n    name = \"api\",\n    srcs = [\"api.cc\"],\n    deps = [\"//engine:model\"],\n)\n"
        "cc_library(\n    name = \"fake\",\n    testonly = True,\n    hdrs = [\"fake.h\"],\n"
        "    deps = [\"//engine/testing:tiny\"],\n)\n"
        "cc_test(\n    name = \"api_test\",\n    deps = [\"//engine:model\"],\n)\n"
        "duet_cc_test_library(\n    name = \"fixture\",\n    srcs = [\"fixture.cc\", \"shared.h\"],\n    deps = [\"//engine:model\"],\n)\n"
        "cc_library(\n    name = \"shared\",\n    hdrs = [\"shared.h\"],\n)\n");
  Write(root / "router/shared.h", "#include \"engine/model.h\"\n");  // a test rule's and a production rule's
  Write(root / "router/fixture.cc", "#include \"engine/model.h\"\n");
  Write(root / "router/api.cc", "#include \"router/api.h\"\n#include \"engine/model.h\"\n");
  Write(root / "router/fake.h", "#include \"engine/model.h\"\n");
  Write(root / "router/api_test.cc", "#include \"engine/model.h\"\n");
  CHECK(Joined(Check(root)) ==
        "router/BUILD:4: router may not depend on engine:model|router/api.cc:2: router may not depend on engine|"
        "router/shared.h:1: router may not depend on engine");
  auto rules = ParseLayerRules(readme);
  REQUIRE(rules.ok());
  CHECK(rules->allowed["router"] == std::set<std::string>{"base"});
  CHECK(rules->test_allowed["router"] == std::set<std::string>{"base", "engine"});
}

TEST_CASE("a list that is malformed is refused") {
  CHECK(!ParseLayerRules("no block").ok());
  CHECK(!ParseLayerRules("<!-- layers -->\n```\nbase\n```\n").ok());
  CHECK(!ParseLayerRules("<!-- layers -->\n```\nbase ->\nbase ->\n```\n").ok());
  CHECK(!ParseLayerRules("<!-- layers -->\n```\nbase -> kernels\n```\n").ok());
  CHECK(!ParseLayerRules("<!-- layers -->\n```\nbase ->\ntools -> | kernels\n```\n").ok());
  CHECK(!ParseLayerRules("<!-- layers -->\n```\nbase ->\ntools -> | base | base\n```\n").ok());
}

// The checkout itself: the README in the runfiles is a link into it.
TEST_CASE("the checkout keeps the README's layers") {
  std::error_code ec;
  fs::path readme = fs::canonical("README.md", ec);
  REQUIRE(!ec);
  std::vector<Violation> v = Check(readme.parent_path());
  INFO(Joined(v, "\n"));
  CHECK(v.empty());
}

}  // namespace
}  // namespace duet::testing

#include "tests/test_models.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tools/model_maker.h"

namespace duet::testing {
namespace fs = std::filesystem;

static fs::path TempRoot() {
  const char* t = std::getenv("TEST_TMPDIR");
  fs::path root = t != nullptr ? fs::path(t) : fs::temp_directory_path() / ("duet-test-" + std::to_string(getpid()));
  fs::create_directories(root);
  return root;
}

std::string TinyModelDir(const std::string& arch) {
  fs::path dir = TempRoot() / ("tiny-" + arch);
  if (!fs::exists(dir / "model.safetensors")) {
    auto s = tools::MakeModel({.size = "tiny", .arch = arch, .seed = 7, .out_dir = dir.string()});
    if (!s.ok()) {
      std::fprintf(stderr, "cannot make the tiny %s model: %s\n", arch.c_str(), s.ToString().c_str());
      std::abort();
    }
  }
  return dir.string();
}

std::string FreshDir(const std::string& name) {
  fs::path dir = TempRoot() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace duet::testing

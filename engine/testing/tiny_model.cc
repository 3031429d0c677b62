#include "engine/testing/tiny_model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "engine/testing/model_maker.h"

namespace duet::testing {
namespace fs = std::filesystem;
namespace {

std::mutex mu;  // Guards making a model, so two threads never write one directory.

fs::path TempRoot() {
  const char* t = std::getenv("TEST_TMPDIR");
  fs::path root = t != nullptr ? fs::path(t) : fs::temp_directory_path() / ("duet-test-" + std::to_string(getpid()));
  fs::create_directories(root);
  return root;
}

}  // namespace

std::string TinyModelDir(const std::string& arch) {
  std::lock_guard<std::mutex> lock(mu);
  fs::path dir = TempRoot() / ("tiny-" + arch);
  if (!fs::exists(dir / "model.safetensors")) {
    auto s = MakeModel({.size = "tiny", .arch = arch, .seed = 7, .out_dir = dir.string()});
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

std::vector<int32_t> RandomTokens(int n, uint32_t seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[static_cast<size_t>(i)] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

}  // namespace duet::testing

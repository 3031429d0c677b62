#include "router/test_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "tools/model_maker.h"

namespace duet::router::testing {

std::string TinyModelDir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir = (std::filesystem::path(tmp ? tmp : "/tmp") / "router-tiny-llama").string();
    if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
      auto s = tools::MakeModel({.size = "tiny", .arch = "llama", .seed = 7, .out_dir = dir});
      if (!s.ok()) {
        std::fprintf(stderr, "cannot make the tiny model: %s\n", s.ToString().c_str());
        std::abort();
      }
    }
  });
  return dir;
}

}  // namespace duet::router::testing

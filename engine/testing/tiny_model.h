// The tiny model directories every package's tests load, made once per test
// binary under $TEST_TMPDIR (or a folder of /tmp named for the process) with
// the model maker; and fresh scratch folders beside them.
//
//   std::string dir = TinyModelDir("mistral");
//   auto model = engine::Model::Load(dir, backend.get());
//
// Thread-safe: a test that starts several threads may call both.
#ifndef DUET_ENGINE_TESTING_TINY_MODEL_H_
#define DUET_ENGINE_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace duet::testing {

// The tiny model of `arch` (llama | mistral | qwen2 | qwen3, see model_maker.h);
// aborts the test binary if it cannot be made.
std::string TinyModelDir(const std::string& arch = "llama");

// A fresh empty directory under the test's temporary folder.
std::string FreshDir(const std::string& name);

// n token ids below `vocab`, the same for the same seed (a 64-bit LCG).
std::vector<int32_t> RandomTokens(int n, uint32_t seed, int vocab);

}  // namespace duet::testing

#endif  // DUET_ENGINE_TESTING_TINY_MODEL_H_

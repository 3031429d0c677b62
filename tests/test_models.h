// Tiny model directories for tests, made once per test binary under
// $TEST_TMPDIR (or /tmp) with tools/model_maker.
//
//   std::string dir = TinyModelDir("mistral");
#ifndef DUET_TESTS_TEST_MODELS_H_
#define DUET_TESTS_TEST_MODELS_H_

#include <string>

namespace duet::testing {

// The tiny model of `arch` (llama | mistral | qwen2); aborts the test binary
// if it cannot be made.
std::string TinyModelDir(const std::string& arch);

// A fresh empty directory under the test's temporary folder.
std::string FreshDir(const std::string& name);

}  // namespace duet::testing

#endif  // DUET_TESTS_TEST_MODELS_H_

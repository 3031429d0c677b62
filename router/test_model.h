// The tiny llama model directory for router tests, made once per test binary
// under $TEST_TMPDIR. The router reads only its tokenizer and configs.
//
//   std::string dir = TinyModelDir();
//   auto tok = engine::Tokenizer::Load(dir);
#ifndef DUET_ROUTER_TEST_MODEL_H_
#define DUET_ROUTER_TEST_MODEL_H_

#include <string>

namespace duet::router::testing {

// Aborts the test binary if the model cannot be made.
std::string TinyModelDir();

}  // namespace duet::router::testing

#endif  // DUET_ROUTER_TEST_MODEL_H_

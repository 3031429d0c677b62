#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "text/tokenizer.h"
#include "tools/commands.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {
namespace {

absl::Status Tokenize(const FlagSet& f) {
  std::string path = f.GetString("tokenizer");
  if (path.empty()) {
    ASSIGN_OR_RETURN(path, testing::EnsureCachedModel("tiny", "llama"));
  }
  ASSIGN_OR_RETURN(auto tok, text::Tokenizer::Load(path));
  const bool decode = f.GetBool("decode");
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    if (decode) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_array()) {
        return absl::InvalidArgumentError(absl::StrCat("stdin line ", n, ": not a JSON array of ids"));
      }
      std::vector<int32_t> ids;
      for (const auto& e : j) {
        if (!e.is_number_integer()) {
          return absl::InvalidArgumentError(absl::StrCat("stdin line ", n, ": ids must be integers"));
        }
        ids.push_back(e.get<int32_t>());
      }
      auto text = tok->Decode(ids);
      if (!text.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("stdin line ", n, ": ", text.status().message()));
      }
      std::fwrite(text->data(), 1, text->size(), stdout);
      std::fputc('\n', stdout);
    } else {
      auto ids = tok->Encode(line);
      if (!ids.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("stdin line ", n, ": ", ids.status().message()));
      }
      std::string out = "[";
      for (size_t i = 0; i < ids->size(); ++i) absl::StrAppend(&out, i ? "," : "", (*ids)[i]);
      out += "]\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  FlagSet f("duet tokenize",
            "Reads lines on stdin and prints one JSON array of token ids per line (nothing added:\n"
            "no BOS, no template tokens), or with --decode reads JSON arrays of ids and prints the\n"
            "text of each.");
  f.String("tokenizer", "",
           "a model directory, a tokenizer.json, or a directory with GPT-2's vocab.json + merges.txt\n"
           "                          (or encoder.json + vocab.bpe); default: the embedded tiny model");
  f.Bool("decode", "ids to text instead of text to ids");
  return RunWithFlags(f, argc, argv, [](const FlagSet& flags) {
    absl::Status s = Tokenize(flags);
    std::fflush(stdout);  // The lines before a bad one come out before its error.
    return s;
  });
}

}  // namespace duet::tools

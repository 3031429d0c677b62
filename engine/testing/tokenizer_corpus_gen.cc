// Writes the tokenizer corpus (engine/testing/tokenizer_corpus.h) to a file, for the
// node scripts in engine/testing/npm and for looking at by hand.
//
//   bazel run //engine/testing:tokenizer_corpus_gen -- --out /tmp/corpus.jsonl
//   bazel run //engine/testing:tokenizer_corpus_gen -- --out /tmp/corpus.txt --format text
#include <cstdio>
#include <string>

#include "base/flags.h"
#include "engine/testing/tokenizer_corpus.h"

int main(int argc, char** argv) {
  duet::FlagSet flags("tokenizer_corpus_gen", "Writes the tokenizer parity corpus to a file.");
  flags.String("out", "", "file to write (required)");
  flags.String("format", "jsonl", "jsonl (one JSON string per record) or text (records back to back)");
  flags.Int("seed", static_cast<int64_t>(duet::testing::kTokenizerCorpusSeed), "generator seed");
  flags.Int("min-bytes", static_cast<int64_t>(duet::testing::kTokenizerCorpusMinBytes),
            "stop once the records add up to this many bytes");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", s.ToString().c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  const std::string out = flags.GetString("out");
  const std::string format = flags.GetString("format");
  if (out.empty() || (format != "jsonl" && format != "text") || flags.GetInt("min-bytes") < 0) {
    std::fprintf(stderr, "need --out FILE, --format jsonl|text and --min-bytes >= 0\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  auto records = duet::testing::TokenizerCorpus(static_cast<uint64_t>(flags.GetInt("seed")),
                                                static_cast<size_t>(flags.GetInt("min-bytes")));
  absl::Status s = format == "jsonl" ? duet::testing::WriteCorpusJsonLines(records, out)
                                     : duet::testing::WriteCorpusText(records, out);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  size_t bytes = 0;
  for (const auto& r : records) bytes += r.size();
  std::fprintf(stderr, "wrote %zu records, %zu bytes of text, to %s\n", records.size(), bytes, out.c_str());
  return 0;
}

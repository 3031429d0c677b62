// The checks shared by the tokenizer parity tests: duet's ids against a
// reference tokenizer's, record by record, and duet's own decode and
// incremental detokenizer against the text that was encoded.
//
//   RequireAllPassed(CompareIds(*tok, records, js_ids), /*min_records=*/1000);
//
// Every check runs over all records and counts failures, describing the
// first few (the record as a JSON string, both id lists with each token's
// bytes), so a failure shows how widespread it is as well as an example.
#ifndef DUET_TESTS_TOKENIZER_PARITY_H_
#define DUET_TESTS_TOKENIZER_PARITY_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace duet::testing {

struct ParityResult {
  size_t records = 0;  // Records checked.
  size_t failed = 0;   // Records that failed.
  size_t tokens = 0;   // Ids duet produced over all records.
  std::string report;  // One summary line, then the first failures.
};

// duet's Encode(records[i]) == expected[i] for every i.
ParityResult CompareIds(const text::Tokenizer& tok, const std::vector<std::string>& records,
                        const std::vector<std::vector<int32_t>>& expected);

// Decode(Encode(record)) == record, and DecodeBytes likewise.
ParityResult CheckRoundTrip(const text::Tokenizer& tok, const std::vector<std::string>& records);

// An IncrementalDetokenizer fed Encode(record) one id at a time yields the
// record, and never a piece that ends inside a UTF-8 character.
ParityResult CheckIncremental(const text::Tokenizer& tok, const std::vector<std::string>& records);

// Prints r's report and fails the running Catch2 test, with the report,
// unless every record passed (and at least `min_records` were checked).
void RequireAllPassed(const ParityResult& r, size_t min_records = 0);

// What a parity test checks: duet's tokenizer, the records, and the ids the
// reference gave each record.
struct ParitySetup {
  std::vector<std::string> records;
  std::unique_ptr<text::Tokenizer> tok;
  std::vector<std::vector<int32_t>> js_ids;
};

// $TEST_TMPDIR/name (/tmp/name outside Bazel), created.
std::filesystem::path ScratchDir(const std::string& name);

// Loads duet's tokenizer from `dir`, writes `records` to dir/corpus.jsonl and
// takes the reference's ids from `script` (run with node_modules `modules`)
// on that file.
absl::StatusOr<ParitySetup> LoadAndEncode(const std::filesystem::path& dir, std::vector<std::string> records,
                                          const std::string& script, const std::string& modules);

// The setup, failing the running Catch2 test with its status if it failed.
const ParitySetup& RequireSetup(const absl::StatusOr<ParitySetup>& setup);

// A string as a JSON literal (control characters escaped, invalid UTF-8
// replaced), for failure messages.
std::string Quote(const std::string& s);

}  // namespace duet::testing

#endif  // DUET_TESTS_TOKENIZER_PARITY_H_

// The structured-output checker: compiles each schema of a JSONSchemaBench-
// style file and feeds each instance through the serving matcher and masks
// token by token (the calls a worker makes), so a verdict is what serving
// would do. Used by `duet structured-check` and //tools/bench:structured.
//
//   ASSIGN_OR_RETURN(auto rows, ReadJsonLines("schemas.jsonl.gz"));
//   SchemaResult r = CheckSchema(rows[0], *tokenizer, vocab);
#ifndef DUET_GRAMMAR_CHECK_H_
#define DUET_GRAMMAR_CHECK_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grammar/vocabulary.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

namespace duet::grammar {

struct InstanceResult {
  bool valid = false;     // the file's label
  bool accepted = false;  // every token allowed by its mask, and the grammar may end
  bool order = false;     // valid, rejected as written, checked again with keys in schema order
};

struct SchemaResult {
  std::string id;
  bool compiled = false;
  std::string error;
  std::string error_keyword;
  std::vector<InstanceResult> tests;
  double compile_us = 0;
  std::vector<double> mask_us;  // per token: the mask and the matcher's advance

  bool Passing() const;
  nlohmann::ordered_json ToJson() const;
};

// One JSON value per line; a ".gz" file is gunzipped.
absl::StatusOr<std::vector<nlohmann::ordered_json>> ReadJsonLines(const std::string& path);

// Whether `data` (as compact JSON, token by token through masks) is accepted
// by `grammar`; appends the per-token times.
SchemaResult CheckSchema(const nlohmann::ordered_json& row, const text::Tokenizer& tokenizer,
                         const std::shared_ptr<const Vocabulary>& vocab);

// Checks every row on `threads` threads (results in row order); `progress`
// is called with the count done now and then.
std::vector<SchemaResult> CheckRows(const std::vector<nlohmann::ordered_json>& rows, const text::Tokenizer& tokenizer,
                                    const std::shared_ptr<const Vocabulary>& vocab, int threads,
                                    const std::function<void(size_t)>& progress);

struct CheckSummary {
  int64_t schemas = 0, compiled = 0, passing = 0;
  int64_t valid = 0, invalid = 0, valid_rejected = 0, invalid_accepted = 0, order = 0, order_rejected = 0;
  std::map<std::string, int64_t> errors;  // compile errors by keyword
  double compile_p50_us = 0, compile_p99_us = 0;
  double mask_p50_us = 0, mask_p99_us = 0, mask_p999_us = 0;
  int64_t masks = 0;
};
CheckSummary Summarize(const std::vector<SchemaResult>& results);
// The summary as text: the counts, the errors by keyword, the times.
std::string FormatSummary(const CheckSummary& s);

// `data` with every object's keys in the order its schema lists them
// (properties, then required names the properties do not list, then the
// rest as they were), following $ref and allOf: the distinct orders that
// differ from data's, read two ways where anyOf/oneOf branches disagree
// (the branch that fits each object best, as the compiler merges it; every
// branch, the first to name a key placing it).
std::vector<nlohmann::ordered_json> ReorderKeys(const nlohmann::ordered_json& data, const nlohmann::ordered_json& schema);

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_CHECK_H_

// JSON Schema to grammar: the values a schema accepts, as compact JSON
// (no whitespace outside strings unless CompileOptions asks for it),
// properties in the schema's order.
//
// Drafts 4, 6, 7, 2019-09 and 2020-12 as real schemas write them (`$schema`
// decides where they differ: draft-04's boolean exclusiveMinimum, `items`
// arrays with `additionalItems` before 2020-12's `prefixItems`). A
// validation keyword, `format` or reference the grammar does not enforce
// fails compilation with a CompileError naming it and its JSON path;
// annotations and unknown keywords are ignored, as JSON Schema says.
//
//   ASSIGN_OR_RETURN(auto grammar, CompileJsonSchemaText(R"({"type":"integer"})", vocab));
#ifndef DUET_GRAMMAR_SCHEMA_H_
#define DUET_GRAMMAR_SCHEMA_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace duet::grammar {

// The keyword a failed compilation stopped at, from its Status message
// ("<keyword> at <path>: <why>"); empty for other errors.
std::string CompileErrorKeyword(const absl::Status& status);

struct CompileOptions {
  // Whitespace (space, tab, newline, carriage return) allowed around the
  // structural characters of objects and arrays, at most `max_whitespace`
  // bytes in a row; off: compact JSON, nothing outside strings.
  bool whitespace = false;
  int32_t max_whitespace = 16;
};

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(const nlohmann::ordered_json& schema,
                                                                 std::shared_ptr<const Vocabulary> vocab,
                                                                 const CompileOptions& options = {});
// InvalidArgument when `schema_json` is not JSON.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchemaText(std::string_view schema_json,
                                                                     std::shared_ptr<const Vocabulary> vocab,
                                                                     const CompileOptions& options = {});

// The output itself (no JSON around it) matches `pattern` whole, as vLLM's
// structured_outputs.regex / guided_regex read it. InvalidArgument naming
// what in the pattern is refused.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegexGrammar(std::string_view pattern,
                                                                   std::shared_ptr<const Vocabulary> vocab);
// The output is exactly one of `choices` (structured_outputs.choice /
// guided_choice). InvalidArgument for an empty list. ("json_object" is
// CompileJsonSchemaText(R"({"type":"object"})").)
absl::StatusOr<std::shared_ptr<const Grammar>> CompileChoiceGrammar(const std::vector<std::string>& choices,
                                                                    std::shared_ptr<const Vocabulary> vocab);

// Tool calls as a chat template writes them: `open` NAME `name_close` ARGS
// `close`, then, when `next_open` is set, any number of further calls
// `next_open` NAME `name_close` ARGS `close`. With `named` the output is that
// function's ARGS `close` alone (the prompt ended with its name). ARGS is
// compact JSON that the function's `parameters` accepts ({} when it has none).
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;
};
struct ToolCallsShape {
  std::vector<ToolSchema> tools;
  std::string named;
  std::string open, name_close, close, next_open;
};
absl::StatusOr<std::shared_ptr<const Grammar>> CompileToolCalls(const ToolCallsShape& shape,
                                                              std::shared_ptr<const Vocabulary> vocab);

// The compact JSON text of a value as duet's grammars write it (and as
// Python's json.dumps(..., ensure_ascii=False, separators=(",", ":")) does).
std::string CompactJson(const nlohmann::ordered_json& value);

}  // namespace duet::grammar

#endif  // DUET_GRAMMAR_SCHEMA_H_

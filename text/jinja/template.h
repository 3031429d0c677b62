// A Jinja2 template engine for the chat templates models ship in their
// tokenizer_config.json, rendering as Hugging Face's transformers does
// (trim_blocks and lstrip_blocks on, loop controls, `generation` blocks
// rendered as their content, its `tojson`):
//
//   ASSIGN_OR_RETURN(Template t, Template::Parse(config["chat_template"]));
//   Value ctx = Value::MakeObject();
//   ctx.mutable_object().Set("messages", Value::FromJson(body["messages"]));
//   ASSIGN_OR_RETURN(std::string prompt, t.Render(ctx));
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else, loop.*
// with cycle, break, continue), set (names, tuples, namespace attributes,
// block form with filters), macro (defaults, caller), call blocks, filter
// blocks, generation; comments; whitespace control with `-` and `+`.
// Expressions: literals (strings with Python escapes, ints, floats, lists,
// tuples, dicts), attributes and subscripts, slices with steps, calls with
// keyword arguments, filters, `is [not]` tests, arithmetic, `~`,
// comparisons, `in`/`not in`, `and`/`or`/`not`, conditional expressions.
// Filters, tests, methods and globals: builtins.h. Not supported (an error
// naming it and its line): extends/block/include/import, recursive loops,
// `do`, raw blocks, autoescaping.
//
// Parse errors and unknown filters or tests are found at Parse; a render
// error (raise_exception, a type error) names its line. Thread-safe: a
// Template is immutable and may be rendered from many threads at once.
#ifndef DUET_ENGINE_JINJA_TEMPLATE_H_
#define DUET_ENGINE_JINJA_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace duet::text::jinja {

struct Node;

class Template {
 public:
  // InvalidArgument "line N: ..." for a template duet cannot render.
  static absl::StatusOr<Template> Parse(absl::string_view source);
  // Renders with the variables of `context` (an object) beside the globals.
  // InvalidArgument "line N: ..." when rendering fails.
  absl::StatusOr<std::string> Render(const Value& context) const;
  // Whether any expression reads the variable `name` (e.g. "documents").
  bool Reads(absl::string_view name) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace duet::text::jinja

#endif  // DUET_ENGINE_JINJA_TEMPLATE_H_

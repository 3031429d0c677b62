// What a template can call without defining it: Jinja's filters and tests,
// the Python methods of strings, dicts and lists that chat templates use,
// and the globals (range, namespace, dict, raise_exception, strftime_now).
// Private to //text/jinja. Errors carry no line: the interpreter adds it.
#ifndef DUET_ENGINE_JINJA_BUILTINS_H_
#define DUET_ENGINE_JINJA_BUILTINS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace duet::text::jinja {

// The items a for loop or a filter walks: a list's items, a dict's keys, a
// string's characters; undefined is empty; anything else an error.
absl::StatusOr<List> Iterate(const Value& v);
bool IsFilter(absl::string_view name);
bool IsTest(absl::string_view name);
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand, Args& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& operand, Args& args);
// obj.name(args) for a string, dict or list `obj`.
absl::StatusOr<Value> CallMethod(const Value& obj, absl::string_view name, Args& args);
// The globals, as one object.
Value Globals();

}  // namespace duet::text::jinja

#endif  // DUET_ENGINE_JINJA_BUILTINS_H_

// The values a Jinja template computes with, as Python's Jinja2 sees them:
// undefined, none, booleans, integers, floats, strings (UTF-8), lists,
// mappings that keep their insertion order (Python dicts; a namespace() is
// one that `set ns.x = ...` may change), and callables (macros, `caller`,
// `loop.cycle`, the globals). Lists and mappings are shared on copy, as
// Python's objects are.
//
//   Value messages = Value::FromJson(nlohmann::ordered_json::parse(body)["messages"]);
//   std::string shown = messages.Str();  // Python's str(): ['a', 'b']
#ifndef DUET_ENGINE_JINJA_VALUE_H_
#define DUET_ENGINE_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::text::jinja {

class Value;
using List = std::vector<Value>;
struct Object;
struct Args;
// A callable's body: its arguments in, its value (or an error) out.
using Function = std::function<absl::StatusOr<Value>(Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kObject, kFunction };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items = {});
  // A Python tuple: a list that prints as (a, b) (dict items, tuple literals).
  static Value MakeTuple(List items);
  static Value MakeObject();
  static Value MakeNamespace();
  static Value MakeFunction(std::string name, Function fn);
  // JSON as Python's json.loads gives it (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && b_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_namespace() const;

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double float_value() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& string_value() const { return s_; }
  const List& list() const { return *list_; }
  List& mutable_list() { return *list_; }
  const Object& object() const { return *object_; }
  Object& mutable_object() { return *object_; }
  const std::string& function_name() const { return s_; }
  absl::StatusOr<Value> Call(Args& args) const { return (*fn_)(args); }

  // Python's bool().
  bool Truthy() const;
  // Python's str() (a string as itself, None as "None", a list as
  // "['a', 1]"); undefined is "".
  std::string Str() const;
  // Python's repr(): strings quoted.
  std::string Repr() const;
  // Jinja's ==: numbers by value (1 == 1.0), lists and mappings deeply.
  bool Equals(const Value& other) const;
  // The type's name as Python says it, for errors: "str", "list", "dict".
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<Function> fn_;
};

// An ordered mapping with string keys.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* Find(absl::string_view key) const;
  void Set(const std::string& key, Value v);
};

// A call's arguments: positional, then keyword in the order given.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index`, or the keyword `name`, or undefined; a keyword
  // taken is marked used.
  Value Get(size_t index, absl::string_view name);
};

// JSON of `v` as Hugging Face's `tojson` writes it (Python's json.dumps with
// ensure_ascii=False): separators ", " and ": ", or "," and ": " with
// `indent`; `separators` overrides both. InvalidArgument for a callable.
struct JsonOptions {
  std::optional<int> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// The number of Unicode code points in UTF-8 `s` (Python's len()).
size_t CodePoints(absl::string_view s);
// UTF-8 `s` split into its code points (Python's list(s)).
std::vector<std::string> SplitCodePoints(absl::string_view s);

}  // namespace duet::text::jinja

#endif  // DUET_ENGINE_JINJA_VALUE_H_

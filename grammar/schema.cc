#include "grammar/schema.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"

namespace duet::grammar {
namespace {

using json = nlohmann::ordered_json;

// Keywords that validate and that the grammar does not enforce.
constexpr const char* kRefused[] = {
    "not",          "if",          "dependencies",     "dependentRequired", "dependentSchemas",
    "propertyNames", "contains",    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef",
};

// Keywords that validate (the rest are annotations or unknown).
bool IsValidationKeyword(const std::string& k) {
  static const std::set<std::string> kValidation = {
      "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
      "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "minLength",
      "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
      "multipleOf", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf", "$ref", "not", "if",
      "dependencies", "dependentRequired", "dependentSchemas", "propertyNames", "contains",
      "unevaluatedProperties", "unevaluatedItems"};
  return kValidation.count(k) > 0;
}

// A calendar date: the days each month has, February 29 in leap years only.
constexpr const char* kDate =
    R"((\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|\d{4}-(0[469]|11)-(0[1-9]|[12]\d|30)|\d{4}-02-(0[1-9]|1\d|2[0-8]))"
    R"(|(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";

// Formats as anchored patterns over the decoded string.
const std::map<std::string, std::string>& FormatPatterns() {
  static const auto* m = new std::map<std::string, std::string>{
      {"date-time", absl::StrCat("^", kDate, R"([Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$)")},
      {"date", absl::StrCat("^", kDate, "$")},
      {"time", R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
      {"email", R"(^[^\s@]+@[^\s@]+$)"},
      {"idn-email", R"(^[^\s@]+@[^\s@]+$)"},
      {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
      {"ipv4", R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)"},
      {"ipv6",
       R"(^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}|:((:[0-9a-fA-F]{1,4}){1,7}|:))$)"},
      {"hostname",
       R"(^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$)"},
      {"uri", R"(^[A-Za-z][A-Za-z0-9+.\-]*:[^\s<>"{}|\\^`]*$)"},
  };
  return *m;
}

// Formats JSON Schema defines that the grammar does not enforce.
bool IsKnownFormat(const std::string& f) {
  static const std::set<std::string> kKnown = {
      "uri-reference", "iri", "iri-reference", "uri-template", "idn-hostname", "json-pointer",
      "relative-json-pointer", "regex", "duration"};
  return kKnown.count(f) > 0;
}

// Compiled format DFAs, shared by every grammar.
absl::StatusOr<std::shared_ptr<const ByteDfa>> FormatDfa(const std::string& name) {
  static absl::Mutex mu;
  static auto* cache = new std::map<std::string, std::shared_ptr<const ByteDfa>>;
  absl::MutexLock lock(&mu);
  auto it = cache->find(name);
  if (it != cache->end()) return it->second;
  ASSIGN_OR_RETURN(ByteDfa d, CompileRegex(FormatPatterns().at(name)));
  auto p = std::make_shared<const ByteDfa>(std::move(d));
  (*cache)[name] = p;
  return p;
}

absl::Status Refuse(const std::string& keyword, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(keyword, " at #", path, ": ", why));
}

std::string PointerToken(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '~' && i + 1 < s.size() && (s[i + 1] == '0' || s[i + 1] == '1')) {
      out.push_back(s[i + 1] == '0' ? '~' : '/');
      ++i;
    } else if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

class Compiler {
 public:
  Compiler(const json& root, Grammar& g) : root_(root), g_(g) {
    if (root.is_object() && root.contains("$schema") && root["$schema"].is_string()) {
      const std::string s = root["$schema"].get<std::string>();
      if (s.find("draft-04") != std::string::npos || s.find("draft-03") != std::string::npos) draft_ = 4;
      else if (s.find("draft-06") != std::string::npos) draft_ = 6;
      else if (s.find("draft-07") != std::string::npos) draft_ = 7;
      else if (s.find("2019-09") != std::string::npos) draft_ = 2019;
    }
    if (root.is_object()) {
      for (const char* k : {"$id", "id"}) {
        if (root.contains(k) && root[k].is_string()) root_id_ = root[k].get<std::string>();
      }
    }
  }

  absl::StatusOr<int32_t> Any() {
    if (any_ >= 0) return any_;
    any_ = NewNode(NodeKind::kUnion);
    Node obj;
    obj.kind = NodeKind::kObject;
    obj.additional = any_;
    Node arr;
    arr.kind = NodeKind::kArray;
    arr.items = any_;
    Node str;
    str.kind = NodeKind::kString;
    Node num;
    num.kind = NodeKind::kNumber;
    std::vector<int32_t> alts;
    ASSIGN_OR_RETURN(int32_t generic_object, AddObject(std::move(obj), {}));
    alts.push_back(generic_object);
    alts.push_back(AddNode(std::move(arr)));
    alts.push_back(AddNode(std::move(str)));
    alts.push_back(AddNode(std::move(num)));
    alts.push_back(Literals({"true", "false", "null"}));
    g_.nodes[any_].alternatives = std::move(alts);
    return any_;
  }

  absl::StatusOr<int32_t> Compile(const json& s, const std::string& path, int depth = 0) {
    if (depth > 64) return Refuse("$ref", path, "references nest deeper than 64");
    if (s.is_boolean()) return s.get<bool>() ? Any() : Never();
    if (!s.is_object()) return Refuse("schema", path, "not an object or boolean");
    for (const char* k : kRefused) {
      if (s.contains(k)) return Refuse(k, path, "not enforced");
    }
    if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>()) {
      const bool trivial = s.contains("maxItems") && s["maxItems"].is_number() && s["maxItems"].get<double>() <= 1;
      if (!trivial) return Refuse("uniqueItems", path, "not enforced");
    }
    if (s.contains("$ref")) {
      bool siblings = false;
      for (const auto& [k, v] : s.items()) siblings |= k != "$ref" && IsValidationKeyword(k);
      ASSIGN_OR_RETURN(const json* target, Resolve(s["$ref"], path));
      if (!siblings || draft_ < 2019) {
        auto it = memo_.find(target);
        if (it != memo_.end()) return it->second;
        const int32_t id = NewNode(NodeKind::kUnion);
        memo_[target] = id;
        ASSIGN_OR_RETURN(int32_t real, Compile(*target, absl::StrCat(path, "/$ref"), depth + 1));
        g_.nodes[id].alternatives = {real};
        return id;
      }
      json rest = s;
      rest.erase("$ref");
      json merged;
      RETURN_IF_ERROR(MergeInto(merged, *target, path, depth + 1));
      RETURN_IF_ERROR(MergeInto(merged, rest, path, depth + 1));
      return Compile(merged, path, depth + 1);
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array()) return Refuse("allOf", path, "not an array");
      // One member with anyOf/oneOf: its alternatives each take the whole
      // allOf (members merged in the schema's order, so properties keep it).
      int with_union = -1, unions = 0;
      const char* union_key = nullptr;
      for (size_t i = 0; i < s["allOf"].size(); ++i) {
        const json* m = &s["allOf"][i];
        if (m->is_object() && m->contains("$ref")) {
          auto t = Resolve((*m)["$ref"], path);
          if (t.ok() && m->size() == 1) m = *t;
        }
        for (const char* k : {"anyOf", "oneOf"}) {
          if (m->is_object() && m->contains(k) && (*m)[k].is_array()) {
            ++unions;
            with_union = static_cast<int>(i);
            union_key = k;
          }
        }
      }
      if (unions == 1 && !s.contains(union_key)) {
        const json* m = &s["allOf"][with_union];
        if (m->contains("$ref") && m->size() == 1) m = *Resolve((*m)["$ref"], path);
        json rest_of_member = *m;
        rest_of_member.erase(union_key);
        json alts = json::array();
        for (const json& a : (*m)[union_key]) {
          json parts = json::array();
          for (int j = 0; j < with_union; ++j) parts.push_back(s["allOf"][j]);
          parts.push_back(rest_of_member);
          parts.push_back(a);
          for (size_t j = with_union + 1; j < s["allOf"].size(); ++j) parts.push_back(s["allOf"][j]);
          alts.push_back(json{{"allOf", parts}});
        }
        json distributed = s;
        distributed.erase("allOf");
        distributed[union_key] = alts;
        return Compile(distributed, path, depth + 1);
      }
      json merged;
      json rest = s;
      rest.erase("allOf");
      RETURN_IF_ERROR(MergeInto(merged, rest, path, depth + 1));
      for (size_t i = 0; i < s["allOf"].size(); ++i) {
        RETURN_IF_ERROR(MergeInto(merged, s["allOf"][i], absl::StrCat(path, "/allOf/", i), depth + 1));
      }
      return Compile(merged, path, depth + 1);
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_array() || s[k].empty()) return Refuse(k, path, "not a non-empty array");
      json base = s;
      base.erase(k);
      bool has_base = false;
      for (const auto& [bk, bv] : base.items()) has_base |= IsValidationKeyword(bk);
      std::vector<int32_t> alts;
      for (size_t i = 0; i < s[k].size(); ++i) {
        const std::string sub = absl::StrCat(path, "/", k, "/", i);
        if (!has_base) {
          ASSIGN_OR_RETURN(int32_t a, Compile(s[k][i], sub, depth + 1));
          alts.push_back(a);
          continue;
        }
        json merged;
        RETURN_IF_ERROR(MergeInto(merged, base, path, depth + 1));
        RETURN_IF_ERROR(MergeInto(merged, s[k][i], sub, depth + 1));
        ASSIGN_OR_RETURN(int32_t a, Compile(merged, sub, depth + 1));
        alts.push_back(a);
      }
      if (std::string(k) == "oneOf" && alts.size() > 1) {
        // The matcher refuses a value two alternatives complete, but it
        // reads keys in one order per alternative: two object alternatives
        // must be provably exclusive, or a value in one's order could match
        // the other in another order unseen.
        for (size_t i = 0; i < alts.size(); ++i) {
          for (size_t j = i + 1; j < alts.size(); ++j) {
            if (!ObjectsExclusive(alts[i], alts[j], 0)) {
              return Refuse("oneOf", path,
                            absl::StrCat("object alternatives ", i, " and ", j,
                                         " are not provably exclusive (no discriminating required property)"));
            }
          }
        }
        const int32_t id = NewNode(NodeKind::kOneOf);
        g_.nodes[id].alternatives = std::move(alts);
        g_.has_one_of = true;
        return id;
      }
      return Union(std::move(alts));
    }
    return CompileTyped(s, path, depth);
  }

 private:
  int32_t NewNode(NodeKind kind) {
    Node n;
    n.kind = kind;
    return AddNode(std::move(n));
  }
  int32_t AddNode(Node n) {
    g_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(g_.nodes.size()) - 1;
  }
  int32_t Never() { return NewNode(NodeKind::kUnion); }
  int32_t Union(std::vector<int32_t> alts) {
    if (alts.size() == 1) return alts[0];
    const int32_t id = NewNode(NodeKind::kUnion);
    g_.nodes[id].alternatives = std::move(alts);
    return id;
  }
  int32_t Literals(const std::vector<std::string>& texts) {
    const int32_t root = static_cast<int32_t>(g_.literals.size());
    g_.literals.emplace_back();
    for (const std::string& t : texts) g_.AddLiteral(root, t);
    Node n;
    n.kind = NodeKind::kLiteral;
    n.literal = root;
    return AddNode(std::move(n));
  }

  // The leaves a node stands for (unions and oneOfs opened).
  void Leaves(int32_t n, std::vector<int32_t>& out, int depth = 0) const {
    const Node& node = g_.nodes[n];
    if ((node.kind == NodeKind::kUnion || node.kind == NodeKind::kOneOf) && depth < 16) {
      for (int32_t a : node.alternatives) Leaves(a, out, depth + 1);
    } else if (node.kind != NodeKind::kUnion && node.kind != NodeKind::kOneOf) {
      out.push_back(n);
    }
  }

  std::set<uint8_t> FirstBytes(int32_t leaf) const {
    const Node& n = g_.nodes[leaf];
    switch (n.kind) {
      case NodeKind::kLiteral: {
        std::set<uint8_t> out;
        for (const auto& [b, child] : g_.literals[n.literal].children) out.insert(b);
        return out;
      }
      case NodeKind::kString: return {'"'};
      case NodeKind::kNumber: return {'-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
      case NodeKind::kObject: return {'{'};
      case NodeKind::kArray: return {'['};
      default: return {};
    }
  }

  void LiteralTexts(int32_t lit, std::string& prefix, std::set<std::string>& out) const {
    if (g_.literals[lit].terminal) out.insert(prefix);
    for (const auto& [b, child] : g_.literals[lit].children) {
      prefix.push_back(static_cast<char>(b));
      LiteralTexts(child, prefix, out);
      prefix.pop_back();
    }
  }

  // No value matches both nodes (a sufficient test).
  bool Disjoint(int32_t a, int32_t b, int depth) const {
    if (depth > 8) return false;
    std::vector<int32_t> la, lb;
    Leaves(a, la);
    Leaves(b, lb);
    for (int32_t x : la) {
      for (int32_t y : lb) {
        const std::set<uint8_t> fx = FirstBytes(x), fy = FirstBytes(y);
        bool overlap = false;
        for (uint8_t c : fx) overlap |= fy.count(c) > 0;
        if (!overlap) continue;
        const Node& nx = g_.nodes[x];
        const Node& ny = g_.nodes[y];
        if (nx.kind == NodeKind::kLiteral && ny.kind == NodeKind::kLiteral) {
          std::set<std::string> tx, ty;
          std::string p;
          LiteralTexts(nx.literal, p, tx);
          LiteralTexts(ny.literal, p, ty);
          for (const auto& t : tx) {
            if (ty.count(t)) return false;
          }
          continue;
        }
        if (nx.kind == NodeKind::kObject && ny.kind == NodeKind::kObject && ObjectsDisjoint(nx, ny, depth + 1)) continue;
        return false;
      }
    }
    return true;
  }

  // Two objects no value matches both: a property both require with
  // disjoint values, or a property one requires that the other forbids.
  bool ObjectsDisjoint(const Node& x, const Node& y, int depth) const {
    for (const Property& px : x.props) {
      if (!px.required) continue;
      for (const Property& py : y.props) {
        if (py.required && py.name == px.name && Disjoint(px.node, py.node, depth)) return true;
      }
    }
    auto forbids = [](const Node& closed, const Node& other) {
      if (closed.additional >= 0 || !closed.pattern_nodes.empty()) return false;
      for (const Property& po : other.props) {
        if (!po.required) continue;
        bool named = false;
        for (const Property& pc : closed.props) named |= pc.name == po.name;
        if (!named) return true;
      }
      return false;
    };
    return forbids(x, y) || forbids(y, x);
  }

  // Object leaves of a and b are pairwise disjoint (other leaves may overlap:
  // the matcher sees every alternative complete those).
  bool ObjectsExclusive(int32_t a, int32_t b, int depth) const {
    std::vector<int32_t> la, lb;
    Leaves(a, la);
    Leaves(b, lb);
    for (int32_t x : la) {
      if (g_.nodes[x].kind != NodeKind::kObject) continue;
      for (int32_t y : lb) {
        if (g_.nodes[y].kind != NodeKind::kObject) continue;
        if (!ObjectsDisjoint(g_.nodes[x], g_.nodes[y], depth + 1)) return false;
      }
    }
    return true;
  }

  absl::StatusOr<const json*> Resolve(const json& ref, const std::string& path) {
    if (!ref.is_string()) return Refuse("$ref", path, "not a string");
    std::string r = ref.get<std::string>();
    if (!root_id_.empty() && r.rfind(root_id_, 0) == 0) r = r.substr(root_id_.size());
    if (r.empty() || r == "#") return &root_;
    if (r[0] != '#') return Refuse("$ref", path, absl::StrCat("reference \"", r, "\" outside the schema"));
    const json* cur = &root_;
    if (r.size() > 1 && r[1] != '/') {  // a plain-name anchor
      const json* found = FindAnchor(root_, r.substr(1));
      if (found == nullptr) return Refuse("$ref", path, absl::StrCat("anchor \"", r, "\" not found"));
      return found;
    }
    for (absl::string_view tok : absl::StrSplit(r.substr(2), '/')) {
      const std::string t = PointerToken(std::string(tok));
      if (cur->is_object() && cur->contains(t)) {
        cur = &(*cur)[t];
      } else if (cur->is_array() && !t.empty() && std::all_of(t.begin(), t.end(), ::isdigit) &&
                 std::stoul(t) < cur->size()) {
        cur = &(*cur)[std::stoul(t)];
      } else {
        return Refuse("$ref", path, absl::StrCat("reference \"", r, "\" not found"));
      }
    }
    return cur;
  }

  const json* FindAnchor(const json& s, const std::string& name) {
    if (s.is_object()) {
      for (const char* k : {"$anchor", "$id", "id"}) {
        if (s.contains(k) && s[k].is_string() &&
            (s[k].get<std::string>() == name || s[k].get<std::string>() == "#" + name)) {
          return &s;
        }
      }
    }
    if (s.is_object() || s.is_array()) {
      for (const auto& v : s) {
        if (const json* f = FindAnchor(v, name)) return f;
      }
    }
    return nullptr;
  }

  // Folds schema `s` into `into` (allOf): both must hold.
  absl::Status MergeInto(json& into, const json& s, const std::string& path, int depth) {
    if (depth > 64) return Refuse("allOf", path, "nests deeper than 64");
    if (s.is_boolean()) {
      if (!s.get<bool>()) into["not"] = json::object();  // unsatisfiable: refused as such
      return absl::OkStatus();
    }
    if (!s.is_object()) return Refuse("allOf", path, "a subschema is not an object");
    if (s.contains("$ref")) {
      ASSIGN_OR_RETURN(const json* target, Resolve(s["$ref"], path));
      json rest = s;
      rest.erase("$ref");
      RETURN_IF_ERROR(MergeInto(into, *target, path, depth + 1));
      return MergeInto(into, rest, path, depth + 1);
    }
    if (s.contains("allOf") && s["allOf"].is_array()) {
      json rest = s;
      rest.erase("allOf");
      RETURN_IF_ERROR(MergeInto(into, rest, path, depth + 1));
      for (const auto& sub : s["allOf"]) RETURN_IF_ERROR(MergeInto(into, sub, path, depth + 1));
      return absl::OkStatus();
    }
    if (into.is_null()) into = json::object();
    for (const auto& [k, v] : s.items()) {
      if (!into.contains(k)) {
        into[k] = v;
        continue;
      }
      json& cur = into[k];
      if (k == "properties" || k == "patternProperties") {
        if (!v.is_object()) continue;
        for (const auto& [pk, pv] : v.items()) {
          if (!cur.contains(pk)) {
            cur[pk] = pv;
          } else if (cur[pk] != pv) {
            cur[pk] = json{{"allOf", json::array({cur[pk], pv})}};
          }
        }
      } else if (k == "required") {
        if (!v.is_array()) continue;
        for (const auto& r : v) {
          if (std::find(cur.begin(), cur.end(), r) == cur.end()) cur.push_back(r);
        }
      } else if (k == "type") {
        auto as_set = [](const json& t) {
          std::set<std::string> out;
          if (t.is_string()) out.insert(t.get<std::string>());
          if (t.is_array()) {
            for (const auto& x : t) {
              if (x.is_string()) out.insert(x.get<std::string>());
            }
          }
          return out;
        };
        const auto a = as_set(cur), b = as_set(v);
        json both = json::array();
        for (const auto& t : a) {
          if (b.count(t) || (t == "integer" && b.count("number"))) both.push_back(t);
          else if (t == "number" && b.count("integer")) both.push_back("integer");
        }
        cur = both;
      } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "minProperties" ||
                 (k == "exclusiveMinimum" && v.is_number() && cur.is_number())) {
        if (v.is_number() && cur.is_number() && v.get<double>() > cur.get<double>()) cur = v;
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties" ||
                 (k == "exclusiveMaximum" && v.is_number() && cur.is_number())) {
        if (v.is_number() && cur.is_number() && v.get<double>() < cur.get<double>()) cur = v;
      } else if (k == "enum") {
        if (!v.is_array() || !cur.is_array()) continue;
        json both = json::array();
        for (const auto& e : cur) {
          if (std::find(v.begin(), v.end(), e) != v.end()) both.push_back(e);
        }
        cur = both;
      } else if (k == "additionalProperties" || k == "items" || k == "additionalItems") {
        if (cur != v) cur = json{{"allOf", json::array({cur, v})}};
      } else if (k == "anyOf" || k == "oneOf") {
        if (cur != v) return Refuse(k, path, "two in one allOf are not merged");
      } else if (IsValidationKeyword(k) && cur != v) {
        return Refuse(k, path, "differs between allOf subschemas");
      }
    }
    return absl::OkStatus();
  }

  bool AllowsType(const std::set<std::string>& types, const json& v) {
    if (types.empty()) return true;
    if (v.is_null()) return types.count("null");
    if (v.is_boolean()) return types.count("boolean");
    if (v.is_string()) return types.count("string");
    if (v.is_object()) return types.count("object");
    if (v.is_array()) return types.count("array");
    if (v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
      return types.count("integer") || types.count("number");
    }
    return types.count("number");
  }

  absl::StatusOr<int32_t> CompileTyped(const json& s, const std::string& path, int depth) {
    std::set<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) types.insert(t.get<std::string>());
      else if (t.is_array()) {
        for (const auto& x : t) {
          if (x.is_string()) types.insert(x.get<std::string>());
        }
        if (types.empty()) return Never();
      } else {
        return Refuse("type", path, "not a string or an array");
      }
      for (const auto& t2 : types) {
        static const std::set<std::string> kTypes = {"null", "boolean", "object", "array", "string", "number", "integer"};
        if (!kTypes.count(t2)) return Refuse("type", path, absl::StrCat("unknown type \"", t2, "\""));
      }
    }
    if (s.contains("const") || s.contains("enum")) {
      std::vector<std::string> texts;
      // A number is equal to its integral twin (2 and 2.0): both texts match.
      auto add = [&](const json& v) {
        if (!AllowsType(types, v)) return;
        texts.push_back(CompactJson(v));
        if (v.is_number() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
          const double x = v.get<double>();
          texts.push_back(CompactJson(v.is_number_float() ? json(static_cast<int64_t>(x)) : json(x)));
        }
      };
      if (s.contains("const")) {
        add(s["const"]);
      } else {
        if (!s["enum"].is_array()) return Refuse("enum", path, "not an array");
        if (s["enum"].empty()) return Refuse("enum", path, "an empty list, which no value matches");
        for (const auto& v : s["enum"]) add(v);
      }
      if (texts.empty()) return Never();
      return Literals(texts);
    }
    if (types.empty()) types = {"null", "boolean", "object", "array", "string", "number"};
    std::vector<int32_t> alts;
    if (types.count("null")) alts.push_back(Literals({"null"}));
    if (types.count("boolean")) alts.push_back(Literals({"true", "false"}));
    if (types.count("number") || types.count("integer")) {
      ASSIGN_OR_RETURN(int32_t n, CompileNumber(s, path, !types.count("number")));
      alts.push_back(n);
    }
    if (types.count("string")) {
      ASSIGN_OR_RETURN(int32_t n, CompileString(s, path));
      alts.push_back(n);
    }
    if (types.count("array")) {
      ASSIGN_OR_RETURN(int32_t n, CompileArray(s, path, depth));
      alts.push_back(n);
    }
    if (types.count("object")) {
      ASSIGN_OR_RETURN(int32_t n, CompileObject(s, path, depth));
      alts.push_back(n);
    }
    return Union(std::move(alts));
  }

  static absl::StatusOr<int64_t> Count(const json& s, const char* k, const std::string& path, int64_t dflt) {
    if (!s.contains(k)) return dflt;
    const json& v = s[k];
    if (!v.is_number() || v.get<double>() < 0) return Refuse(k, path, "not a non-negative number");
    const double d = v.get<double>();
    return d > 9e15 ? dflt : static_cast<int64_t>(std::ceil(d));
  }

  absl::StatusOr<int32_t> CompileNumber(const json& s, const std::string& path, bool integer) {
    Node n;
    n.kind = NodeKind::kNumber;
    n.integer = integer;
    auto number = [&](const char* k, double* out) -> absl::StatusOr<bool> {
      if (!s.contains(k)) return false;
      if (s[k].is_boolean()) return false;
      if (!s[k].is_number()) return Refuse(k, path, "not a number");
      *out = s[k].get<double>();
      return true;
    };
    ASSIGN_OR_RETURN(n.has_minimum, number("minimum", &n.minimum));
    ASSIGN_OR_RETURN(n.has_maximum, number("maximum", &n.maximum));
    for (const auto& [key, is_min] : {std::pair<const char*, bool>{"exclusiveMinimum", true}, {"exclusiveMaximum", false}}) {
      if (!s.contains(key)) continue;
      const json& v = s[key];
      if (v.is_boolean()) {  // draft-04: a flag on minimum / maximum
        if (v.get<bool>()) (is_min ? n.exclusive_minimum : n.exclusive_maximum) = true;
        continue;
      }
      if (!v.is_number()) return Refuse(key, path, "not a number or boolean");
      const double x = v.get<double>();
      double& bound = is_min ? n.minimum : n.maximum;
      bool& has = is_min ? n.has_minimum : n.has_maximum;
      bool& excl = is_min ? n.exclusive_minimum : n.exclusive_maximum;
      if (!has || (is_min ? x >= bound : x <= bound)) {
        bound = x;
        has = true;
        excl = true;
      }
    }
    if (s.contains("multipleOf")) {
      if (!s["multipleOf"].is_number() || s["multipleOf"].get<double>() <= 0) {
        return Refuse("multipleOf", path, "not a positive number");
      }
      n.multiple_of = s["multipleOf"].get<double>();
    }
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> CompileString(const json& s, const std::string& path) {
    Node n;
    n.kind = NodeKind::kString;
    ASSIGN_OR_RETURN(n.min_length, Count(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(n.max_length, Count(s, "maxLength", path, -1));
    std::shared_ptr<const ByteDfa> dfa;
    if (s.contains("format") && s["format"].is_string()) {
      const std::string f = s["format"].get<std::string>();
      if (FormatPatterns().count(f)) {
        ASSIGN_OR_RETURN(dfa, FormatDfa(f));
      } else if (IsKnownFormat(f)) {
        return Refuse("format", path, absl::StrCat("format \"", f, "\" not enforced"));
      }
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Refuse("pattern", path, "not a string");
      if (dfa != nullptr) return Refuse("pattern", path, "pattern together with a format not enforced");
      const std::string pattern = s["pattern"].get<std::string>();
      auto it = pattern_dfas_.find(pattern);
      if (it != pattern_dfas_.end()) {
        n.dfa = it->second;  // one DFA per pattern text, so its masks are computed once
      } else {
        auto d = CompileRegex(pattern);
        if (!d.ok()) return Refuse("pattern", path, d.status().message());
        dfa = std::make_shared<const ByteDfa>(std::move(*d));
        pattern_dfas_[pattern] = static_cast<int32_t>(g_.dfas.size());
      }
    }
    if (dfa != nullptr) {
      auto found = std::find(g_.dfas.begin(), g_.dfas.end(), dfa);
      n.dfa = static_cast<int32_t>(found - g_.dfas.begin());
      if (found == g_.dfas.end()) g_.dfas.push_back(std::move(dfa));
    }
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> CompileArray(const json& s, const std::string& path, int depth) {
    Node n;
    n.kind = NodeKind::kArray;
    ASSIGN_OR_RETURN(n.min_items, Count(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(n.max_items, Count(s, "maxItems", path, -1));
    const json* tuple = nullptr;
    const json* rest = nullptr;
    std::string rest_path;
    if (s.contains("prefixItems")) {
      tuple = &s["prefixItems"];
      if (s.contains("items")) rest = &s["items"], rest_path = path + "/items";
    } else if (s.contains("items") && s["items"].is_array()) {
      tuple = &s["items"];
      if (s.contains("additionalItems")) rest = &s["additionalItems"], rest_path = path + "/additionalItems";
    } else if (s.contains("items")) {
      rest = &s["items"], rest_path = path + "/items";
    }
    if (tuple != nullptr) {
      if (!tuple->is_array()) return Refuse("prefixItems", path, "not an array");
      for (size_t i = 0; i < tuple->size(); ++i) {
        ASSIGN_OR_RETURN(int32_t item, Compile((*tuple)[i], absl::StrCat(path, "/items/", i), depth + 1));
        n.prefix.push_back(item);
      }
    }
    if (rest == nullptr) {
      ASSIGN_OR_RETURN(n.items, Any());
    } else if (rest->is_boolean() && !rest->get<bool>()) {
      n.items = -1;
    } else {
      ASSIGN_OR_RETURN(n.items, Compile(*rest, rest_path, depth + 1));
    }
    return AddNode(std::move(n));
  }

  // The object node and its key node, whose DFA tags `alts` (the names,
  // the patterns) and, when other keys are allowed, any string.
  absl::StatusOr<int32_t> AddObject(Node n, std::vector<DfaAlternative> alts) {
    const int32_t np = static_cast<int32_t>(n.props.size());
    n.next_required.assign(np + 1, np);
    for (int32_t i = np - 1; i >= 0; --i) n.next_required[i] = n.props[i].required ? i : n.next_required[i + 1];
    const int32_t obj = AddNode(std::move(n));
    Node key;
    key.kind = NodeKind::kKey;
    key.object = obj;
    if (g_.nodes[obj].additional >= 0) {
      key.open = true;
      alts.push_back({DfaAlternative::Kind::kAnything, "",
                      np + static_cast<int32_t>(g_.nodes[obj].pattern_nodes.size())});
    }
    ASSIGN_OR_RETURN(ByteDfa d, CompileAlternatives(alts));
    key.dfa = static_cast<int32_t>(g_.dfas.size());
    g_.dfas.push_back(std::make_shared<const ByteDfa>(std::move(d)));
    const int32_t k = AddNode(std::move(key));
    g_.nodes[obj].key = k;
    return obj;
  }

  absl::StatusOr<int32_t> CompileObject(const json& s, const std::string& path, int depth) {
    Node n;
    n.kind = NodeKind::kObject;
    ASSIGN_OR_RETURN(n.min_properties, Count(s, "minProperties", path, 0));
    ASSIGN_OR_RETURN(n.max_properties, Count(s, "maxProperties", path, -1));
    std::set<std::string> required;
    if (s.contains("required") && s["required"].is_array()) {
      for (const auto& r : s["required"]) {
        if (r.is_string()) required.insert(r.get<std::string>());
      }
    }
    std::vector<DfaAlternative> alts;
    std::set<std::string> named;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return Refuse("properties", path, "not an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        if (sub.is_boolean() && !sub.get<bool>() && !required.count(name)) continue;
        ASSIGN_OR_RETURN(int32_t v, Compile(sub, absl::StrCat(path, "/properties/", name), depth + 1));
        alts.push_back({DfaAlternative::Kind::kLiteral, name, static_cast<int32_t>(n.props.size())});
        n.props.push_back({name, v, required.count(name) > 0});
        named.insert(name);
      }
    }
    // Required names the properties do not list take the schema other keys get.
    std::vector<std::string> extra_required;
    if (s.contains("required") && s["required"].is_array()) {
      for (const auto& r : s["required"]) {
        if (r.is_string() && !named.count(r.get<std::string>())) {
          extra_required.push_back(r.get<std::string>());
          named.insert(r.get<std::string>());
        }
      }
    }
    std::vector<std::pair<std::string, int32_t>> patterns;
    if (s.contains("patternProperties")) {
      if (!s["patternProperties"].is_object()) return Refuse("patternProperties", path, "not an object");
      for (const auto& [pat, sub] : s["patternProperties"].items()) {
        ASSIGN_OR_RETURN(int32_t v, Compile(sub, absl::StrCat(path, "/patternProperties/", pat), depth + 1));
        patterns.push_back({pat, v});
      }
    }
    if (!s.contains("additionalProperties") || s["additionalProperties"] == json(true)) {
      ASSIGN_OR_RETURN(n.additional, Any());
    } else if (s["additionalProperties"] == json(false)) {
      n.additional = -1;
    } else {
      ASSIGN_OR_RETURN(n.additional, Compile(s["additionalProperties"], path + "/additionalProperties", depth + 1));
    }
    // Each pattern compiled once here, so a refused one is named as
    // patternProperties; required names the properties do not list take
    // the schema of the first pattern they match.
    std::vector<ByteDfa> pattern_dfas;
    for (const auto& [pat, node] : patterns) {
      auto d = CompileRegex(pat);
      if (!d.ok()) return Refuse("patternProperties", path, d.status().message());
      pattern_dfas.push_back(std::move(*d));
    }
    for (const std::string& name : extra_required) {
      int32_t v = n.additional;
      for (size_t k = 0; k < patterns.size(); ++k) {
        if (pattern_dfas[k].Matches(name)) {
          v = patterns[k].second;
          break;
        }
      }
      if (v < 0) v = Never();
      alts.push_back({DfaAlternative::Kind::kLiteral, name, static_cast<int32_t>(n.props.size())});
      n.props.push_back({name, v, true});
    }
    const int32_t np = static_cast<int32_t>(n.props.size());
    for (size_t k = 0; k < patterns.size(); ++k) {
      alts.push_back({DfaAlternative::Kind::kPattern, patterns[k].first, np + static_cast<int32_t>(k)});
      n.pattern_nodes.push_back(patterns[k].second);
    }
    auto obj = AddObject(std::move(n), std::move(alts));
    if (!obj.ok()) return Refuse("properties", path, obj.status().message());
    return *obj;
  }

  const json& root_;
  Grammar& g_;
  int draft_ = 2020;
  std::string root_id_;
  int32_t any_ = -1;
  std::map<const json*, int32_t> memo_;
  std::map<std::string, int32_t> pattern_dfas_;
};

}  // namespace

std::string CompileErrorKeyword(const absl::Status& status) {
  const absl::string_view m = status.message();
  const size_t at = m.find(" at ");
  if (status.ok() || at == absl::string_view::npos) return "";
  return std::string(m.substr(0, at));
}

std::string CompactJson(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(const nlohmann::ordered_json& schema,
                                                                 std::shared_ptr<const Vocabulary> vocab,
                                                                 const CompileOptions& options) {
  auto g = std::make_shared<Grammar>(std::move(vocab));
  g->max_whitespace = options.whitespace ? std::max(options.max_whitespace, 1) : 0;
  Compiler c(schema, *g);
  ASSIGN_OR_RETURN(g->root, c.Compile(schema, ""));
  g->ComputeNullable();
  return g;
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchemaText(std::string_view schema_json,
                                                                     std::shared_ptr<const Vocabulary> vocab,
                                                                     const CompileOptions& options) {
  nlohmann::ordered_json schema = nlohmann::ordered_json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("schema: not valid JSON");
  return CompileJsonSchema(schema, std::move(vocab), options);
}

namespace {

// A grammar whose root is its one node (a raw regex, a choice list).
std::shared_ptr<const Grammar> OneNodeGrammar(std::shared_ptr<Grammar> g, Node root) {
  g->nodes.push_back(std::move(root));
  g->root = 0;
  g->ComputeNullable();
  return g;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegexGrammar(std::string_view pattern,
                                                                   std::shared_ptr<const Vocabulary> vocab) {
  auto d = CompileRegex(absl::StrCat("^(?:", std::string(pattern), ")$"));
  if (!d.ok()) return Refuse("regex", "", d.status().message());
  auto g = std::make_shared<Grammar>(std::move(vocab));
  g->dfas.push_back(std::make_shared<const ByteDfa>(std::move(*d)));
  Node n;
  n.kind = NodeKind::kRaw;
  n.dfa = 0;
  return OneNodeGrammar(std::move(g), std::move(n));
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileChoiceGrammar(const std::vector<std::string>& choices,
                                                                    std::shared_ptr<const Vocabulary> vocab) {
  if (choices.empty()) return Refuse("choice", "", "an empty list of choices");
  auto g = std::make_shared<Grammar>(std::move(vocab));
  g->literals.emplace_back();
  for (const std::string& c : choices) g->AddLiteral(0, c);
  Node n;
  n.kind = NodeKind::kLiteral;
  n.literal = 0;
  return OneNodeGrammar(std::move(g), std::move(n));
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileToolCalls(const ToolCallsShape& shape,
                                                              std::shared_ptr<const Vocabulary> vocab) {
  if (shape.tools.empty()) return Refuse("tools", "", "no function to call");
  auto g = std::make_shared<Grammar>(std::move(vocab));
  auto add = [&](Node n) {
    g->nodes.push_back(std::move(n));
    return static_cast<int32_t>(g->nodes.size()) - 1;
  };
  auto literal = [&](std::string_view text) {
    Node n;
    n.kind = NodeKind::kLiteral;
    n.literal = static_cast<int32_t>(g->literals.size());
    g->literals.emplace_back();
    g->AddLiteral(n.literal, text);
    return add(std::move(n));
  };
  auto seq = [&](std::vector<int32_t> items) {
    Node n;
    n.kind = NodeKind::kSeq;
    n.sequence = std::move(items);
    return add(std::move(n));
  };
  // One call's name, arguments and close, per function.
  std::vector<int32_t> calls;
  const nlohmann::ordered_json empty = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shape.tools.size(); ++i) {
    const ToolSchema& t = shape.tools[i];
    if (!shape.named.empty() && t.name != shape.named) continue;
    const nlohmann::ordered_json& params = t.parameters.is_null() ? empty : t.parameters;
    Compiler c(params, *g);
    absl::StatusOr<int32_t> args = c.Compile(params, "");
    if (!args.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "].function.parameters: ", args.status().message()));
    }
    const int32_t close = literal(shape.close);
    calls.push_back(shape.named.empty() ? seq({literal(absl::StrCat(t.name, shape.name_close)), *args, close})
                                        : seq({*args, close}));
  }
  if (calls.empty()) return Refuse("tool_choice", "", absl::StrCat("no function named '", shape.named, "'"));
  int32_t call = calls[0];
  if (calls.size() > 1) {
    Node u;
    u.kind = NodeKind::kUnion;
    u.alternatives = calls;
    call = add(std::move(u));
  }
  std::vector<int32_t> items;
  if (!shape.open.empty()) items.push_back(literal(shape.open));
  items.push_back(call);
  if (shape.named.empty() && !shape.next_open.empty()) {
    Node r;
    r.kind = NodeKind::kRepeat;
    r.repeat = seq({literal(shape.next_open), call});
    r.min_items = 0;
    r.max_items = -1;
    items.push_back(add(std::move(r)));
  }
  g->root = seq(std::move(items));
  g->ComputeNullable();
  return g;
}

}  // namespace duet::grammar

#include "grammar/check.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

namespace duet::grammar {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

const json* Follow(const json* s, const json& root) {
  for (int i = 0; i < 32 && s != nullptr && s->is_object() && s->contains("$ref"); ++i) {
    const json& r = (*s)["$ref"];
    if (!r.is_string()) return s;
    std::string p = r.get<std::string>();
    const size_t hash = p.find('#');
    if (hash == std::string::npos) return s;
    p = p.substr(hash + 1);
    if (p.empty()) {
      s = &root;
      continue;
    }
    try {
      s = &root.at(json::json_pointer(p));
    } catch (...) {
      return nullptr;
    }
  }
  return s;
}

bool PatternMatches(const std::string& pattern, const std::string& s) {
  auto d = CompileRegex(pattern);
  return d.ok() && d->Matches(s);
}

// The schemas an object at `s` answers to, in the order the compiler merges
// them (a schema's own keywords, its allOf members, then the anyOf/oneOf
// alternative that fits `d` best), so their properties give its key order.
void Collect(const json* s, const json& d, const json& root, std::vector<const json*>& out, int depth = 0);

int Fit(const json* a, const json& d, const json& root) {
  std::vector<const json*> parts;
  Collect(a, d, root, parts, 8);
  int score = 0;
  for (const json* p : parts) {
    if (p->contains("required") && (*p)["required"].is_array()) {
      for (const auto& r : (*p)["required"]) {
        if (r.is_string() && d.is_object() && !d.contains(r.get<std::string>())) score -= 1000;
      }
    }
    if (p->contains("properties") && (*p)["properties"].is_object() && d.is_object()) {
      for (const auto& [k, v] : d.items()) score += (*p)["properties"].contains(k);
    }
  }
  return score;
}

void Collect(const json* s, const json& d, const json& root, std::vector<const json*>& out, int depth) {
  s = Follow(s, root);
  if (s == nullptr || !s->is_object() || depth > 16) return;
  out.push_back(s);
  if (s->contains("allOf") && (*s)["allOf"].is_array()) {
    for (const auto& m : (*s)["allOf"]) Collect(&m, d, root, out, depth + 1);
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s->contains(k) || !(*s)[k].is_array() || (*s)[k].empty()) continue;
    const json* best = nullptr;
    int best_fit = 0;
    for (const auto& a : (*s)[k]) {
      const int f = Fit(&a, d, root);
      if (best == nullptr || f > best_fit) best = &a, best_fit = f;
    }
    Collect(best, d, root, out, depth + 1);
  }
}

json Reorder(const json& d, const json* schema, const json& root, int depth) {
  if (depth > 64 || schema == nullptr) return d;
  std::vector<const json*> parts;
  Collect(schema, d, root, parts);
  if (d.is_object()) {
    std::vector<std::string> order;
    std::set<std::string> seen;
    auto add = [&](const std::string& k) {
      if (seen.insert(k).second) order.push_back(k);
    };
    for (const json* p : parts) {
      if (p->contains("properties") && (*p)["properties"].is_object()) {
        for (const auto& [k, v] : (*p)["properties"].items()) add(k);
      }
    }
    for (const json* p : parts) {
      if (p->contains("required") && (*p)["required"].is_array()) {
        for (const auto& r : (*p)["required"]) {
          if (r.is_string()) add(r.get<std::string>());
        }
      }
    }
    auto sub = [&](const std::string& k) -> const json* {
      for (const json* p : parts) {
        if (p->contains("properties") && (*p)["properties"].is_object() && (*p)["properties"].contains(k)) {
          return &(*p)["properties"][k];
        }
      }
      for (const json* p : parts) {
        if (!p->contains("patternProperties") || !(*p)["patternProperties"].is_object()) continue;
        for (const auto& [pattern, v] : (*p)["patternProperties"].items()) {
          if (PatternMatches(pattern, k)) return &v;
        }
      }
      for (const json* p : parts) {
        if (p->contains("additionalProperties") && (*p)["additionalProperties"].is_object()) {
          return &(*p)["additionalProperties"];
        }
      }
      return nullptr;
    };
    json out = json::object();
    for (const std::string& k : order) {
      if (d.contains(k)) out[k] = Reorder(d[k], sub(k), root, depth + 1);
    }
    for (const auto& [k, v] : d.items()) {
      if (!out.contains(k)) out[k] = Reorder(v, sub(k), root, depth + 1);
    }
    return out;
  }
  if (d.is_array()) {
    json out = json::array();
    for (size_t i = 0; i < d.size(); ++i) {
      const json* item = nullptr;
      for (const json* p : parts) {
        for (const char* k : {"prefixItems", "items", "additionalItems"}) {
          if (item != nullptr || !p->contains(k)) continue;
          const json& it = (*p)[k];
          if (it.is_array() && i < it.size()) item = &it[i];
          if (it.is_object()) item = &it;
        }
      }
      out.push_back(Reorder(d[i], item, root, depth + 1));
    }
    return out;
  }
  return d;
}

// The schemas an instance at `s` answers to: s and its allOf/anyOf/oneOf
// branches, in order.
void Branches(const json* s, const json& root, std::vector<const json*>& out, int depth = 0) {
  s = Follow(s, root);
  if (s == nullptr || !s->is_object() || depth > 16) return;
  out.push_back(s);
  for (const char* k : {"allOf", "anyOf", "oneOf"}) {
    if (s->contains(k) && (*s)[k].is_array()) {
      for (const auto& b : (*s)[k]) Branches(&b, root, out, depth + 1);
    }
  }
}

// The other reading of "the schema's order": every branch a key may answer
// to is a candidate, and the first to name a key decides its place.
json ReorderByAllBranches(const json& d, const std::vector<const json*>& schemas, const json& root, int depth) {
  if (depth > 64) return d;
  std::vector<const json*> branches;
  for (const json* s : schemas) Branches(s, root, branches);
  if (d.is_object()) {
    std::vector<std::string> order;
    std::set<std::string> seen;
    auto add = [&](const std::string& k) {
      if (seen.insert(k).second) order.push_back(k);
    };
    for (const json* b : branches) {
      if (b->contains("properties") && (*b)["properties"].is_object()) {
        for (const auto& [k, v] : (*b)["properties"].items()) add(k);
      }
    }
    for (const json* b : branches) {
      if (b->contains("required") && (*b)["required"].is_array()) {
        for (const auto& r : (*b)["required"]) {
          if (r.is_string()) add(r.get<std::string>());
        }
      }
    }
    auto sub = [&](const std::string& k) {
      std::vector<const json*> out;
      for (const json* b : branches) {
        if (b->contains("properties") && (*b)["properties"].is_object() && (*b)["properties"].contains(k)) {
          out.push_back(&(*b)["properties"][k]);
        }
      }
      for (const json* b : branches) {
        if (b->contains("additionalProperties") && (*b)["additionalProperties"].is_object()) {
          out.push_back(&(*b)["additionalProperties"]);
        }
        if (b->contains("patternProperties") && (*b)["patternProperties"].is_object()) {
          for (const auto& [p, v] : (*b)["patternProperties"].items()) out.push_back(&v);
        }
      }
      return out;
    };
    json out = json::object();
    for (const std::string& k : order) {
      if (d.contains(k)) out[k] = ReorderByAllBranches(d[k], sub(k), root, depth + 1);
    }
    for (const auto& [k, v] : d.items()) {
      if (!out.contains(k)) out[k] = ReorderByAllBranches(v, sub(k), root, depth + 1);
    }
    return out;
  }
  if (d.is_array()) {
    json out = json::array();
    for (size_t i = 0; i < d.size(); ++i) {
      std::vector<const json*> items;
      for (const json* b : branches) {
        for (const char* k : {"prefixItems", "items", "additionalItems"}) {
          if (!b->contains(k)) continue;
          const json& it = (*b)[k];
          if (it.is_array() && i < it.size()) items.push_back(&it[i]);
          if (it.is_object()) items.push_back(&it);
        }
      }
      out.push_back(ReorderByAllBranches(d[i], items, root, depth + 1));
    }
    return out;
  }
  return d;
}

// Feeds the instance's tokens through masks and the matcher.
bool Accepts(const std::shared_ptr<const Grammar>& g, const text::Tokenizer& tok, const json& data,
             std::vector<uint64_t>& mask, std::vector<double>& mask_us) {
  const std::string text = CompactJson(data);
  auto ids = tok.Encode(text);
  if (!ids.ok()) return false;
  Matcher m(g);
  for (int32_t id : *ids) {
    const auto t0 = Clock::now();
    m.FillMask(mask.data());
    const bool allowed = (mask[id / 64] >> (id % 64)) & 1;
    const bool advanced = allowed && m.AcceptToken(id);
    mask_us.push_back(Micros(t0, Clock::now()));
    if (!advanced) return false;
  }
  return m.CanEnd();
}

}  // namespace

std::vector<json> ReorderKeys(const json& data, const json& schema) {
  std::vector<json> out;
  for (json r : {Reorder(data, &schema, schema, 0), ReorderByAllBranches(data, {&schema}, schema, 0)}) {
    if (r != data && std::find(out.begin(), out.end(), r) == out.end()) out.push_back(std::move(r));
  }
  return out;
}

bool SchemaResult::Passing() const {
  if (!compiled) return false;
  for (const InstanceResult& t : tests) {
    if (t.valid != t.accepted) return false;
  }
  return true;
}

json SchemaResult::ToJson() const {
  json j = json::object();
  j["id"] = id;
  j["compiled"] = compiled;
  j["error"] = compiled ? json(nullptr) : json(error);
  json tests_json = json::array();
  for (const InstanceResult& t : tests) tests_json.push_back({{"valid", t.valid}, {"accepted", t.accepted}, {"order", t.order}});
  j["tests"] = tests_json;
  j["compile_us"] = compile_us;
  j["mask_us"] = mask_us;
  return j;
}

absl::StatusOr<std::vector<json>> ReadJsonLines(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string all;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) all.append(buf, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream"));
  std::vector<json> rows;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(all, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    json j = json::parse(std::string_view(line.data(), line.size()), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": not valid JSON"));
    rows.push_back(std::move(j));
  }
  return rows;
}

SchemaResult CheckSchema(const json& row, const text::Tokenizer& tokenizer, const std::shared_ptr<const Vocabulary>& vocab) {
  SchemaResult r;
  r.id = row.value("id", "");
  const json schema = row.contains("schema") ? row["schema"] : json(true);
  const auto t0 = Clock::now();
  auto g = CompileJsonSchema(schema, vocab);
  r.compile_us = Micros(t0, Clock::now());
  if (!g.ok()) {
    r.error = std::string(g.status().message());
    r.error_keyword = CompileErrorKeyword(g.status());
    if (r.error_keyword.empty()) r.error_keyword = "(other)";
  } else {
    r.compiled = true;
  }
  std::vector<uint64_t> mask(vocab->mask_words());
  if (!row.contains("tests") || !row["tests"].is_array()) return r;
  for (const json& t : row["tests"]) {
    InstanceResult ir;
    ir.valid = t.value("valid", false);
    if (r.compiled && t.contains("data")) {
      ir.accepted = Accepts(*g, tokenizer, t["data"], mask, r.mask_us);
      if (!ir.accepted && ir.valid) {
        for (const json& reordered : ReorderKeys(t["data"], schema)) {
          ir.order = true;
          ir.accepted = Accepts(*g, tokenizer, reordered, mask, r.mask_us);
          if (ir.accepted) break;
        }
      }
    }
    r.tests.push_back(ir);
  }
  return r;
}

std::vector<SchemaResult> CheckRows(const std::vector<json>& rows, const text::Tokenizer& tokenizer,
                                    const std::shared_ptr<const Vocabulary>& vocab, int threads,
                                    const std::function<void(size_t)>& progress) {
  std::vector<SchemaResult> out(rows.size());
  std::atomic<size_t> next{0}, done{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < rows.size();) {
      out[i] = CheckSchema(rows[i], tokenizer, vocab);
      const size_t d = done.fetch_add(1) + 1;
      if (progress && d % 200 == 0) progress(d);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

namespace {

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

}  // namespace

CheckSummary Summarize(const std::vector<SchemaResult>& results) {
  CheckSummary s;
  std::vector<double> compile, mask;
  for (const SchemaResult& r : results) {
    ++s.schemas;
    compile.push_back(r.compile_us);
    if (!r.compiled) {
      ++s.errors[r.error_keyword];
      continue;
    }
    ++s.compiled;
    s.passing += r.Passing();
    for (const InstanceResult& t : r.tests) {
      if (t.valid) {
        ++s.valid;
        s.valid_rejected += !t.accepted;
        s.order += t.order;
        s.order_rejected += t.order && !t.accepted;
      } else {
        ++s.invalid;
        s.invalid_accepted += t.accepted;
      }
    }
    mask.insert(mask.end(), r.mask_us.begin(), r.mask_us.end());
  }
  s.masks = static_cast<int64_t>(mask.size());
  s.compile_p50_us = Percentile(compile, 0.5);
  s.compile_p99_us = Percentile(compile, 0.99);
  s.mask_p50_us = Percentile(mask, 0.5);
  s.mask_p99_us = Percentile(mask, 0.99);
  s.mask_p999_us = Percentile(mask, 0.999);
  return s;
}

std::string FormatSummary(const CheckSummary& s) {
  std::string out = absl::StrCat("schemas: ", s.schemas, ", compiled ", s.compiled, ", passing ", s.passing, " (",
                                 absl::StrFormat("%.1f", 100.0 * s.passing / std::max<int64_t>(1, s.schemas)), "%)\n");
  absl::StrAppend(&out, "instances of compiled schemas: valid ", s.valid, " (rejected ", s.valid_rejected,
                  "; key order tagged ", s.order, ", rejected after reordering ", s.order_rejected, "), invalid ",
                  s.invalid, " (accepted ", s.invalid_accepted, ")\n");
  std::vector<std::pair<int64_t, std::string>> errs;
  for (const auto& [k, n] : s.errors) errs.push_back({-n, k});
  std::sort(errs.begin(), errs.end());
  absl::StrAppend(&out, "compile errors by keyword:");
  for (const auto& [n, k] : errs) absl::StrAppend(&out, " ", k, " ", -n, ";");
  absl::StrAppend(&out, errs.empty() ? " none\n" : "\n");
  absl::StrAppend(&out, absl::StrFormat("compile time p50 %.0f us, p99 %.0f us; mask time (%d tokens) p50 %.1f us, p99 %.1f us, p99.9 %.1f us\n",
                                        s.compile_p50_us, s.compile_p99_us, s.masks, s.mask_p50_us, s.mask_p99_us,
                                        s.mask_p999_us));
  return out;
}

}  // namespace duet::grammar

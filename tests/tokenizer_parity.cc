#include "tests/tokenizer_parity.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/testing/tokenizer_corpus.h"
#include "engine/testing/tokenizer_node.h"

namespace duet::testing {
namespace {

constexpr size_t kExamples = 3;  // Failures described in full.

// "id "bytes"" for each id, and a marker before the first one that differs.
std::string DescribeIds(const text::Tokenizer& tok, const std::vector<int32_t>& ids, size_t mark) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ", ";
    if (i == mark) s += ">>> ";
    auto piece = tok.TokenBytes(ids[i]);
    absl::StrAppend(&s, ids[i], " ", piece.ok() ? Quote(std::string(*piece)) : "(not in vocabulary)");
  }
  if (mark == ids.size()) s += " >>> (ends here)";
  return s + "]";
}

void Finish(ParityResult& r, const char* what) {
  r.report = absl::StrCat(what, ": ", r.failed, " of ", r.records, " records failed (", r.tokens,
                          " tokens)\n", r.report);
}

// Encodes each record and counts it failed when `check` names a problem
// with its ids ("" for none), describing the first few.
ParityResult CheckEach(const text::Tokenizer& tok, const std::vector<std::string>& records, const char* what,
                       const std::function<std::string(const std::vector<int32_t>&, const std::string&)>& check) {
  ParityResult r;
  r.records = records.size();
  for (size_t i = 0; i < records.size(); ++i) {
    auto ids = tok.Encode(records[i]);
    std::string problem;
    if (!ids.ok()) {
      problem = "Encode: " + ids.status().ToString();
    } else {
      r.tokens += ids->size();
      problem = check(*ids, records[i]);
    }
    if (problem.empty()) continue;
    if (++r.failed <= kExamples)
      absl::StrAppend(&r.report, "record ", i, ": ", Quote(records[i]), "\n  ", problem, "\n");
  }
  Finish(r, what);
  return r;
}

}  // namespace

std::string Quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ParityResult CompareIds(const text::Tokenizer& tok, const std::vector<std::string>& records,
                        const std::vector<std::vector<int32_t>>& expected) {
  ParityResult r;
  r.records = records.size();
  if (expected.size() != records.size()) {
    r.failed = records.size();
    r.report =
        absl::StrCat("the reference gave ", expected.size(), " id lists for ", records.size(), " records");
    return r;
  }
  for (size_t i = 0; i < records.size(); ++i) {
    auto ids = tok.Encode(records[i]);
    if (ids.ok()) r.tokens += ids->size();
    if (ids.ok() && *ids == expected[i]) continue;
    if (++r.failed > kExamples) continue;
    absl::StrAppend(&r.report, "record ", i, ": ", Quote(records[i]), "\n");
    if (!ids.ok()) {
      absl::StrAppend(&r.report, "  duet: ", ids.status().ToString(), "\n");
      continue;
    }
    auto diff = std::mismatch(ids->begin(), ids->end(), expected[i].begin(), expected[i].end());
    size_t at = static_cast<size_t>(diff.first - ids->begin());
    absl::StrAppend(&r.report, "  duet: ", DescribeIds(tok, *ids, at),
                    "\n  js:   ", DescribeIds(tok, expected[i], at), "\n");
  }
  Finish(r, "ids equal to the reference's");
  return r;
}

ParityResult CheckRoundTrip(const text::Tokenizer& tok, const std::vector<std::string>& records) {
  return CheckEach(tok, records, "Decode(Encode(record)) == record",
                   [&](const std::vector<int32_t>& ids, const std::string& record) -> std::string {
                     auto text = tok.Decode(ids);
                     auto bytes = tok.DecodeBytes(ids);
                     if (!text.ok()) return "Decode: " + text.status().ToString();
                     if (*text != record) return "Decode gave " + Quote(*text);
                     if (!bytes.ok() || *bytes != record)
                       return "DecodeBytes gave " + (bytes.ok() ? Quote(*bytes) : bytes.status().ToString());
                     return "";
                   });
}

ParityResult CheckIncremental(const text::Tokenizer& tok, const std::vector<std::string>& records) {
  return CheckEach(tok, records, "IncrementalDetokenizer one id at a time == record",
                   [&](const std::vector<int32_t>& ids, const std::string& record) -> std::string {
                     text::IncrementalDetokenizer detok(&tok);
                     std::string out;
                     for (size_t k = 0; k < ids.size(); ++k) {
                       auto piece = detok.Push(ids[k]);
                       if (!piece.ok())
                         return absl::StrCat("Push(", ids[k], ") at ", k, ": ", piece.status().ToString());
                       if (!text::IsValidUtf8(*piece))
                         return absl::StrCat("Push(", ids[k], ") at ", k, " returned invalid UTF-8 ", Quote(*piece));
                       out += *piece;
                     }
                     out += detok.Finish();
                     return out != record ? "streamed " + Quote(out) : "";
                   });
}

void RequireAllPassed(const ParityResult& r, size_t min_records) {
  std::printf("%s", r.report.c_str());
  INFO(r.report);
  REQUIRE(r.records >= min_records);
  REQUIRE(r.failed == 0);
}

std::filesystem::path ScratchDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::filesystem::create_directories(dir);
  return dir;
}

absl::StatusOr<ParitySetup> LoadAndEncode(const std::filesystem::path& dir, std::vector<std::string> records,
                                          const std::string& script, const std::string& modules) {
  ParitySetup s;
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> tok = text::Tokenizer::Load(dir.string());
  if (!tok.ok()) return tok.status();
  s.tok = std::move(*tok);
  s.records = std::move(records);
  std::string corpus = (dir / "corpus.jsonl").string();
  if (absl::Status st = WriteCorpusJsonLines(s.records, corpus); !st.ok()) return st;
  absl::StatusOr<std::string> out = RunNodeScript(script, {corpus}, modules);
  if (!out.ok()) return out.status();
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = ParseIdLines(*out);
  if (!ids.ok()) return ids.status();
  s.js_ids = std::move(*ids);
  return s;
}

const ParitySetup& RequireSetup(const absl::StatusOr<ParitySetup>& setup) {
  INFO(setup.status().ToString());
  REQUIRE(setup.ok());
  return *setup;
}

}  // namespace duet::testing

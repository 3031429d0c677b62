// The Jinja engine, construct by construct: each case's text is what
// Python's Jinja2 renders under Hugging Face's settings (trim_blocks,
// lstrip_blocks), and each unsupported or malformed template fails with its
// line. The parity test (//tests:chat_template_parity_test) renders real
// models' templates against the reference implementation.
#include "text/jinja/template.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace duet::text::jinja {
namespace {

std::string Render(const std::string& source, const std::string& context_json = "{}") {
  auto t = Template::Parse(source);
  INFO(source);
  INFO(t.status());
  REQUIRE(t.ok());
  auto out = t->Render(Value::FromJson(nlohmann::ordered_json::parse(context_json)));
  INFO(out.status());
  REQUIRE(out.ok());
  return *out;
}

std::string ParseError(const std::string& source) {
  auto t = Template::Parse(source);
  INFO(source);
  REQUIRE(!t.ok());
  return std::string(t.status().message());
}

std::string RenderError(const std::string& source, const std::string& context_json = "{}") {
  auto t = Template::Parse(source);
  INFO(source);
  INFO(t.status());
  REQUIRE(t.ok());
  auto out = t->Render(Value::FromJson(nlohmann::ordered_json::parse(context_json)));
  REQUIRE(!out.ok());
  return std::string(out.status().message());
}

TEST_CASE("statements: if/elif/else, for with loop.*, else, filter, break and continue", "[jinja]") {
  CHECK(Render("{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", R"({"x": 2})") == "two");
  CHECK(Render("{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", R"({"x": 5})") == "many");
  CHECK(Render("{% for m in ms %}{{ loop.index }}/{{ loop.length }}:{{ m }}{% if not loop.last %},{% endif %}"
               "{% endfor %}",
               R"({"ms": ["a", "b", "c"]})") == "1/3:a,2/3:b,3/3:c");
  CHECK(Render("{% for m in ms %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
               "{% endfor %}",
               R"({"ms": [1, 2]})") == "021True110False");
  CHECK(Render("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", R"({"xs": [1, 2, 3]})") ==
        "-2;1-3;2-;");
  CHECK(Render("{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", R"({"xs": [1, 2, 3]})") ==
        "odd even odd ");
  CHECK(Render("{% for x in xs %}{{ x }}{% else %}none{% endfor %}", R"({"xs": []})") == "none");
  CHECK(Render("{% for x in xs if x > 1 %}{{ x }}{{ loop.length }} {% endfor %}", R"({"xs": [1, 2, 3]})") ==
        "22 32 ");
  CHECK(Render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
               "{{ x }}{% endfor %}",
               R"({"xs": [1, 2, 3, 4, 5]})") == "13");
  CHECK(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})") ==
        "b=1;a=2;");
  CHECK(Render("{% for k in d %}{{ k }}{% endfor %}", R"({"d": {"b": 1, "a": 2}})") == "ba");
  CHECK(Render("{% for x in xs %}{% for y in x %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
               R"({"xs": [[7, 8], [9]]})") == "121|12|");
}

TEST_CASE("set: names, tuples, namespaces, block sets; loop scopes do not leak", "[jinja]") {
  CHECK(Render("{% set x = 3 %}{% set a, b = [1, 2] %}{{ x + a + b }}") == "6");
  CHECK(Render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i * 10 %}{% endfor %}{{ x }}") == "1");
  CHECK(Render("{% set ns = namespace(total=0, seen=false) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}"
               "{% endfor %}{{ ns.total }} {{ ns.seen }}") == "6 False");
  CHECK(Render("{% set block | upper %}hi {{ name }}{% endset %}[{{ block }}]", R"({"name": "bo"})") == "[HI BO]");
  CHECK(RenderError("{% set x = 1 %}{% set x.y = 2 %}").find("line 1") != std::string::npos);
}

TEST_CASE("macros, call blocks with caller, filter blocks, generation blocks", "[jinja]") {
  CHECK(Render("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}"
               "{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet(name='c') }}") == "hi a! hi b? hi c!");
  CHECK(Render("{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}"
               "{% call box('t') %}inside{% endcall %}") == "[t: inside]");
  CHECK(Render("{% macro row(x) %}<{{ caller(x * 2) }}>{% endmacro %}"
               "{% call(v) row(4) %}v={{ v }}{% endcall %}") == "<v=8>");
  CHECK(Render("{% filter upper %}abc {{ x }}{% endfilter %}", R"({"x": "d"})") == "ABC D");
  CHECK(Render("a{% generation %}b{{ x }}{% endgeneration %}c", R"({"x": 1})") == "ab1c");
  CHECK(RenderError("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("at most 1") != std::string::npos);
}

TEST_CASE("expressions: arithmetic, ~, comparisons, in, tests, conditions, slices, literals", "[jinja]") {
  CHECK(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 }}") ==
        "3 -4 1 2 1024 3.5 7");
  CHECK(Render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }}") == "a1None ababab [1, 2]");
  CHECK(Render("{{ 1 < 2 and 'x' or 'y' }} {{ 0 or '' or 'z' }} {{ not 0 }}") == "x z True");
  CHECK(Render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}") ==
        "True True True True");
  CHECK(Render("{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ d is mapping }} "
               "{{ l is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ s is not number }}",
               R"({"x": 1, "n": null, "s": "t", "d": {}, "l": []})") ==
        "True True True True True True True True True True");
  CHECK(Render("{{ 'yes' if x else 'no' }}|{{ 'only' if y }}|", R"({"x": true})") == "yes||");
  CHECK(Render("{{ xs[1:] }} {{ xs[::-1] }} {{ xs[-1] }} {{ xs[:2] }} {{ s[1:3] }} {{ s[::-1] }}",
               R"({"xs": [1, 2, 3], "s": "h\u00e9llo"})") == "[2, 3] [3, 2, 1] 3 [1, 2] \xc3\xa9l oll\xc3\xa9h");
  CHECK(Render("{{ {'a': [1, 2.5, true, none]} }} {{ (1, 2) }} {{ (1,) }} {{ 'it''s' }} {{ \"q\\n\" }}") ==
        "{'a': [1, 2.5, True, None]} (1, 2) (1,) its q\n");
  CHECK(Render("{{ m.role }}{{ m['role'] }}{{ m.missing }}{{ xs.0 }}", R"({"m": {"role": "user"}, "xs": [5]})") ==
        "useruser5");
}

TEST_CASE("filters and methods chat templates call", "[jinja]") {
  CHECK(Render("[{{ '  a b \n' | trim }}] {{ 'Ab' | upper }} {{ 'Ab' | lower }} {{ 'hello world' | title }}") ==
        "[a b] AB ab Hello World");
  CHECK(Render("{{ xs | length }} {{ 'h\u00e9' | length }} {{ xs | join(', ') }} {{ xs | first }} {{ xs | last }}",
               R"({"xs": ["a", "b", "c"]})") == "3 2 a, b, c a c");
  CHECK(Render("{{ 'a-b-c' | replace('-', '+') }} {{ x | default('d') }} {{ '' | default('e', true) }}") ==
        "a+b+c d e");
  CHECK(Render("{{ users | map(attribute='name') | join(',') }} {{ ['a', 'b'] | map('upper') | list }}",
               R"({"users": [{"name": "x"}, {"name": "y"}]})") == "x,y ['A', 'B']");
  CHECK(Render("{{ items | selectattr('type', 'equalto', 'text') | map(attribute='v') | join }}"
               "{{ items | rejectattr('type', 'equalto', 'text') | list | length }}"
               "{{ items | selectattr('flag') | list | length }}",
               R"({"items": [{"type": "text", "v": "A"}, {"type": "image", "flag": true}, {"type": "text", "v": "B"}]})") ==
        "AB11");
  CHECK(Render("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {{ d | dictsort }}", R"({"d": {"b": 2, "a": 1}})") ==
        "b2a1 [('a', 1), ('b', 2)]");
  CHECK(Render("{{ d | tojson }}", R"({"d": {"a": [1, "x\n\u00e9"], "b": null, "c": true}})") ==
        "{\"a\": [1, \"x\\n\xc3\xa9\"], \"b\": null, \"c\": true}");
  CHECK(Render("{{ d | tojson(indent=2) }}", R"({"d": {"a": [1], "b": {}}})") ==
        "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  CHECK(Render("{{ d | tojson(separators=(',', ':'), sort_keys=true) }} {{ s | tojson(ensure_ascii=true) }}",
               R"({"d": {"b": 1, "a": 2}, "s": "\u00e9\ud83d\ude00"})") == "{\"a\":2,\"b\":1} \"\\u00e9\\ud83d\\ude00\"");
  CHECK(Render("{{ s.startswith('<a') }} {{ s.endswith(('x', '>')) }} {{ s.split('>') }} {{ '  x '.strip() }} "
               "{{ 'xxhixx'.strip('x') }} {{ '\\nhi'.lstrip('\\n') }} {{ 'a b  c'.split() }} {{ 'hi there'.title() }}"
               " {{ 'ab'.upper() }}",
               R"({"s": "<a>b"})") == "True False ['<a', 'b'] x hi hi ['a', 'b', 'c'] Hi There AB");
  CHECK(Render("{{ 'a</think>b'.split('</think>')[-1] }} {{ d.get('x', 5) }} {{ d.keys() | list }}",
               R"({"d": {"k": 1}})") == "b 5 ['k']");
  CHECK(Render("{{ [3, 1, 2] | sort }} {{ [1, 1, 2] | unique | list }} {{ [1, 5] | max }} {{ [1.5, 2] | sum }} "
               "{{ '3' | int + 1 }} {{ 2.567 | round(2) }} {{ -3 | abs }} {{ 'x' | string }}") ==
        "[1, 2, 3] [1, 2] 5 3.5 4 2.57 3 x");
  CHECK(Render("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}") == "a\n  b|  a\n  b");
  CHECK(Render("{{ range(3) | list }} {{ range(1, 7, 2) | join(',') }} {{ dict(a=1) }}") == "[0, 1, 2] 1,3,5 {'a': 1}");
  CHECK(Render("{{ strftime_now('%Y') | length }}") == "4");
}

TEST_CASE("whitespace: trim_blocks, lstrip_blocks, - and +, comments, the trailing newline", "[jinja]") {
  CHECK(Render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n") == "a\n  b\nc");
  CHECK(Render("a  {%- if true -%}  b  {%- endif %}") == "ab");
  CHECK(Render("a {{- ' x ' -}} b") == "a x b");
  CHECK(Render("  {%+ if true %}x{% endif +%}\ny") == "  x\ny");
  CHECK(Render("a{# note #}\nb {#- more -#} c") == "abc");
  CHECK(Render("x\n\n") == "x\n");
}

TEST_CASE("raise_exception and type errors name their line", "[jinja]") {
  std::string e = RenderError("ok\n{{ raise_exception('roles must alternate') }}");
  CHECK(e.find("line 2") != std::string::npos);
  CHECK(e.find("roles must alternate") != std::string::npos);
  CHECK(RenderError("{{ 'a' + 1 }}").find("unsupported operand types for +: 'str' and 'int'") != std::string::npos);
  CHECK(RenderError("{{ nothere() }}").find("'nothere' is undefined") != std::string::npos);
  CHECK(RenderError("{% for x in 3 %}{% endfor %}").find("cannot loop over 'int'") != std::string::npos);
  CHECK(RenderError("{{ 'x'.nomethod() }}").find("has no method 'nomethod'") != std::string::npos);
}

TEST_CASE("malformed or unsupported templates fail at Parse, naming the construct and line", "[jinja]") {
  CHECK(ParseError("a\n{% if x %}b") == "line 2: 'if' is never closed (expected {% elif %} or {% else %} or {% endif %})");
  CHECK(ParseError("{{ x | nosuchfilter }}") == "line 1: unknown filter 'nosuchfilter'");
  CHECK(ParseError("\n\n{% if x is nosuchtest %}{% endif %}") == "line 3: unknown test 'nosuchtest'");
  CHECK(ParseError("{% extends 'base' %}") == "line 1: unknown or unsupported statement 'extends'");
  CHECK(ParseError("{% include 'x' %}").find("unsupported statement 'include'") != std::string::npos);
  CHECK(ParseError("{% for x in y recursive %}{% endfor %}") == "line 1: recursive for loops are not supported");
  CHECK(ParseError("{{ 'abc }}") == "line 1: a string literal is never closed");
  CHECK(ParseError("{{ x ").find("is never closed") != std::string::npos);
  CHECK(ParseError("{# comment") == "line 1: a comment ({#) is never closed");
  CHECK(ParseError("{{ x + }}") == "line 1: expected an expression, found '}}'");
  CHECK(ParseError("{% for x y %}{% endfor %}") == "line 1: expected 'in' in the for tag, found 'y'");
  CHECK(ParseError("{% set %}") == "line 1: expected a variable name to set, found '%}'");
  CHECK(ParseError("{{ a ? b }}") == "line 1: unexpected character '?' in a tag");
  CHECK(ParseError("{% endif %}") == "line 1: unknown or unsupported statement 'endif'");
  CHECK(ParseError("{% macro m( %}{% endmacro %}").find("expected a parameter name") != std::string::npos);
  CHECK(ParseError("{% call m %}{% endcall %}") == "line 1: a call block needs a macro call ({% call name(...) %})");
  CHECK(ParseError("{% call(x) m() %}body") ==
        "line 1: 'call' is never closed (expected {% endcall %})");
  CHECK(ParseError("{% macro m() %}body") == "line 1: 'macro' is never closed (expected {% endmacro %})");
  CHECK(ParseError("{% filter %}x{% endfilter %}") == "line 1: expected a filter name, found '%}'");
  CHECK(ParseError("{% filter upper %}x") == "line 1: 'filter' is never closed (expected {% endfilter %})");
  CHECK(ParseError("{% set x %}abc") == "line 1: 'set' is never closed (expected {% endset %})");
  CHECK(ParseError("{% set a.b %}x{% endset %}") ==
        "line 1: a block set ({% set x %}...{% endset %}) takes one plain name");
  CHECK(ParseError("{% generation %}x") == "line 1: 'generation' is never closed (expected {% endgeneration %})");
  CHECK(ParseError("{% for x in y %}{% else %}{% else %}{% endfor %}") ==
        "line 1: unknown or unsupported statement 'else'");
  CHECK(ParseError("{{ x[1:2:3:4] }}") == "line 1: a slice takes at most two ':'");
  CHECK(ParseError("{{ x is }}") == "line 1: expected a test name after 'is', found '}}'");
  CHECK(ParseError("{{ f(a=1, 2) }}") == "line 1: a positional argument after a keyword argument");
  CHECK(ParseError("{{ {'a' 1} }}") == "line 1: expected ':', found '1'");
  CHECK(ParseError("{{ x.1a }}").find("line 1") != std::string::npos);
  CHECK(RenderError("{% break %}") == "line 1: break or continue outside a for loop");
  CHECK(RenderError("{% set ns = namespace(m=none) %}{% for i in [1] %}{% macro inner() %}x{% endmacro %}"
                    "{% set ns.m = inner %}{% endfor %}{{ ns.m() }}")
            .find("called after the scope it was defined in ended") != std::string::npos);
}

TEST_CASE("Reads names the variables a template uses", "[jinja]") {
  auto t = Template::Parse("{% for d in documents %}{{ d.text }}{% endfor %}{{ messages | length }}");
  REQUIRE(t.ok());
  CHECK(t->Reads("documents"));
  CHECK(t->Reads("messages"));
  CHECK(!t->Reads("tools"));
}

}  // namespace
}  // namespace duet::text::jinja

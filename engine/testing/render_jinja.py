#!/usr/bin/env python3
"""Renders chat templates as Hugging Face's transformers does: Python's
Jinja2 (Debian's python3-jinja2) in an immutable sandbox with trim_blocks and
lstrip_blocks, loop controls, the `generation` tag, and transformers' own
tojson, raise_exception and strftime_now. Each line of the input file is a
JSON string holding {"template": ..., "context": {...}}; prints one JSON
object per line: {"text": ...} or {"error": ...}; with --time N, also
"us": the median of N renders' microseconds. The parity test
//tests:chat_template_parity_test compares duet's Jinja engine with this,
and //tools/bench:chat_template times both.

  python3 engine/testing/render_jinja.py cases.jsonl [--time N] > rendered.jsonl
"""
import json
import statistics
import sys
import time
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: its content, as transformers' AssistantTracker renders it."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--time"):
        sys.exit("usage: render_jinja.py CASES.jsonl [--time N]")
    reps = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = {}
    out = []
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            case = json.loads(json.loads(line))
            try:
                t = compiled.get(case["template"])
                if t is None:
                    t = compiled[case["template"]] = env.from_string(case["template"])
                result = {"text": t.render(**case["context"])}
                if reps > 0:
                    times = []
                    for _ in range(reps):
                        start = time.perf_counter()
                        t.render(**case["context"])
                        times.append((time.perf_counter() - start) * 1e6)
                    result["us"] = statistics.median(times)
                out.append(json.dumps(result))
            except Exception as e:  # the template's own errors are results here
                out.append(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.stdout.write("".join(o + "\n" for o in out))


if __name__ == "__main__":
    main()

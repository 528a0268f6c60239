#!/usr/bin/env python3
"""Randomised differential test (fixed seeds) of atlas's template interpreter against jinja2 in
HF's chat-template configuration: (1) whitespace control — random mixes of text, {{ }}, comments
and nested if/for blocks with '-' / '+' markers around spaces, tabs, newlines, CRLF and Unicode
spaces; (2) expressions — random operator/filter/test trees over ints, floats, strings, lists,
tuples, dicts, none and booleans. Output must be byte-identical; where jinja2 raises, atlas must
fail too. The only tolerated difference is a documented refusal (printf-style '%' formatting,
integers beyond 64 bits), reported as such."""
import json
import os
import random
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

BIN = os.environ.get("ATLAS_BIN", "build/atlas")
REFUSALS = ("printf-style string formatting", "64-bit")


def hf_env():
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    return env


TEXT = ["a", " ", "  ", "\t", "\n", "\n\n", " \n", "\n  ", "x y", "\r\n", "\u3000", "\xa0", " \t\n \t"]


def ws_template(rng, depth=0):
    out = ""
    for _ in range(rng.randint(1, 6)):
        c = rng.random()
        if c < 0.45:
            out += rng.choice(TEXT)
        elif c < 0.6:
            out += "{{" + rng.choice(["", "-"]) + " 'v' " + rng.choice(["", "-"]) + "}}"
        elif c < 0.7:
            out += "{#" + rng.choice(["", "-", "+"]) + " c " + rng.choice(["", "-", "+"]) + "#}"
        elif depth < 2 and c < 0.85:
            m = [rng.choice(["", "-", "+"]) for _ in range(4)]
            out += "{%" + m[0] + " if true " + m[1] + "%}" + ws_template(rng, depth + 1) + "{%" + m[2] + " endif " + m[3] + "%}"
        elif depth < 2:
            m = [rng.choice(["", "-"]) for _ in range(4)]
            out += ("{%" + m[0] + " for i in [1, 2] " + m[1] + "%}" + ws_template(rng, depth + 1) +
                    "{%" + m[2] + " endfor " + m[3] + "%}")
    return out


ATOMS = ["0", "1", "-3", "7", "2.5", "0.1", "3.0", "1e-7", "1e17", "'ab'", "'x y'", "''", "[1, 2]", "[]", "none",
         "true", "false", "(1, 'a')", "{'k': 1}", "n", "f", "s", "l"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in"]
FILTERS = ["| string", "| length", "| tojson", "| int", "| float", "| abs", "| first", "| last", "| list", "| trim",
           "| upper", "| round(1)", "| default('d')", "is number", "is string", "is sequence", "is none"]
VARS = {"n": 5, "f": -1.25, "s": "héllo", "l": [3, "b", None]}


def expr(rng, depth=0):
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    c = rng.random()
    if c < 0.55:
        return "(" + expr(rng, depth + 1) + " " + rng.choice(OPS) + " " + expr(rng, depth + 1) + ")"
    if c < 0.75:
        return "(" + expr(rng, depth + 1) + " " + rng.choice(FILTERS) + ")"
    if c < 0.85:
        return "(not " + expr(rng, depth + 1) + ")"
    if c < 0.92:
        return "(" + expr(rng, depth + 1) + " if " + expr(rng, depth + 1) + " else " + expr(rng, depth + 1) + ")"
    return "-(" + expr(rng, depth + 1) + ")"


def main():
    env = hf_env()
    rng = random.Random(20261130)
    cases = [ws_template(rng) for _ in range(150)] + ["{{ " + expr(rng) + " }}" for _ in range(250)]
    bad = refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({}, f)
        msgs = os.path.join(tmp, "m.json")
        with open(msgs, "w") as f:
            json.dump({"messages": [], "kwargs": VARS}, f)
        tpath = os.path.join(tmp, "t.jinja")
        for t in cases:
            try:
                want, want_err = env.from_string(t).render(**VARS), None
            except Exception as e:  # noqa: BLE001 - any Jinja failure means atlas must fail
                want, want_err = None, e
            with open(tpath, "w", encoding="utf-8", newline="") as f:
                f.write(t)
            r = subprocess.run([BIN, "render", "--model", tmp, "--template", tpath, "--messages", msgs],
                               capture_output=True)
            got, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
            if r.returncode != 0 and any(x in err for x in REFUSALS):
                refused += 1
                continue
            if want_err is not None:
                ok = r.returncode != 0 and got == ""
            else:
                ok = r.returncode == 0 and got == want
            if not ok:
                bad += 1
                if bad <= 5:
                    print("MISMATCH %r\n  jinja: %r\n  atlas: rc=%d %r %s" % (
                        t, want if want_err is None else "raised %s" % want_err, r.returncode, got, err.strip()))
    print("%d/%d random templates identical; %d refused as documented" % (len(cases) - bad - refused, len(cases), refused))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

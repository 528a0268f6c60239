#!/usr/bin/env python3
"""Construct-by-construct differential test of atlas's template interpreter against Jinja2 in
Hugging Face's chat-template configuration (see test_template_conformance.py for the setup).

Each snippet is a small template written for this test; it is rendered by python3-jinja2 and by
`atlas render --template` with the same variables, and the outputs must be byte-identical. Snippets
that Jinja rejects (syntax or runtime error) must make atlas fail too, with a message naming the
template line."""
import datetime
import json
import os
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

BIN = os.environ.get("ATLAS_BIN", "build/atlas")

MESSAGES = [
    {"role": "system", "content": "  Sys prompt\n"},
    {"role": "user", "content": "Hello, Wörld! 你好 👋", "name": "u1"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nAnswer: 42", "extra": {"k": [1, 2.5, None, True]}},
    {"role": "user", "content": ""},
]
KWARGS = {"bos_token": "<s>", "eos_token": "</s>", "flag": False, "num": 7, "f": 2.5, "neg": -3, "big": 10**15,
          "s": "a,b,,c", "ws": " \t x y \n", "lst": [3, 1, 2], "d": {"b": 1, "a": [1, {"z": "é\"\\\n\t\u0001"}]},
          "empty": [], "none_v": None, "uni": "ÄÖÜ ßﬁ ΣΑΣ İ ǅ"}

SNIPPETS = [
    # text, output, comments, whitespace control
    "plain text only",
    "a\n",
    "a\n\n",
    "{{ 'x' }}\n{{ 'y' }}\n",
    "  {% if true %}\n  in\n  {% endif %}\n  out",
    "a  {% if true %}x{% endif %}  \n b",
    "line\n    {# comment #}\nnext",
    "x {#- trimmed -#} y",
    "a   {{- 'b' -}}   \n c",
    "  {%+ if true %}kept{% endif %}",
    "{% if true +%}\nnewline kept{% endif %}",
    "{% if true -%}   \n\n  stripped{%- endif %}   end",
    "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n",
    "\t{% for i in [1,2] %}{{ i }}\t{% endfor %}",
    "{% raw %}{{ not rendered }} {% if %}{% endraw %}",
    "a\r\nb\rc\n",
    "{{ 'a' }}{# c #}\n  {{ 'b' }}",
    "x\u3000{%- if true %}y{% endif %}",
    # literals and printing
    "{{ 1 }} {{ -1 }} {{ 1.0 }} {{ 1.5e3 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1_000 }} {{ 123456789012345678 }}",
    "{{ true }} {{ True }} {{ none }} {{ None }} {{ false }}",
    "{{ 'single' }} {{ \"double\" }} {{ 'con' 'cat' }} {{ 'esc\\n\\t\\\\\\'' }} {{ '\\u00e9\\x41' }}",
    "{{ [1, 'two', 3.0, none, true, [], {}] }}",
    "{{ {'a': 1, 'b': [1, 2], 3: 'x'} }}",
    "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}",
    "{{ \"it's\" }} {{ ['it\\'s', 'say \"x\"', 'both \\' \"'] }}",
    "{{ ['\\x01', '\\u200b', 'é', '\\n', '\\U0001F600'] }}",
    "{{ d }} {{ lst }} {{ none_v }} {{ f }} {{ big }}",
    # arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }} {{ 1 + 1.0 }} {{ true + 1 }} {{ 3 * 'ab' }} {{ [1] * 3 }}",
    "{{ -2 ** 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 1 ~ 2 ~ none }} {{ 'a' ~ [1] }}",
    "{{ [1] + [2] }} {{ 'a' + 'b' }} {{ -num }} {{ +num }} {{ -f }}",
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 2 >= 2 }} {{ 2 <= 1 }}",
    "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'b' in {'b': 1} }} {{ 3 not in [1] }} {{ 'x' in undefined_thing }}",
    "{{ true and 'yes' }} {{ 0 or 'fallback' }} {{ '' and 'x' }} {{ none or 0 }} {{ not 0 }} {{ not 'a' == 'a' }}",
    "{{ 'yes' if num > 5 else 'no' }} {{ 'x' if flag }}|{{ 'a' if false else 'b' if true else 'c' }}",
    # names, attributes, subscripts, slices
    "{{ messages[1].role }} {{ messages[1]['content'] }} {{ messages[-1].content }}|{{ messages[9] }}|{{ messages[1].nope }}|",
    "{{ d.a[1].z }} {{ d['a'][0] }} {{ lst.0 }} {{ d['b'] }}|",
    "{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ lst[1:] }} {{ lst[::2] }} {{ lst[:-1] }} {{ 'héllo'[1] }} {{ lst[5:] }}",
    "{{ undefined_name }}|{{ undefined_name is defined }}|{{ none_v.attr }}|{{ num.real_nope }}|",
    # statements
    "{% if num == 7 %}seven{% elif num == 8 %}eight{% else %}other{% endif %}",
    "{% if flag %}a{% elif none_v %}b{% endif %}|",
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if not loop.last else '-' }} {% endfor %}",
    "{% for x in empty %}x{% else %}empty{% endfor %}{% for x in [1] %}one{% else %}no{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.role }} {% endfor %}",
    "{% for c in 'héé' %}[{{ c }}]{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for i in range(1, 10, 3) %}{{ i }}{{ loop.cycle('a', 'b') }}{% endfor %} {{ range(3) | list }} {{ range(5, 0, -2) | list }}",
    "{% set x = 1 %}{% set y, z = 2, 3 %}{{ x }}{{ y }}{{ z }}",
    "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% if true %}{% set leak = 'yes' %}{% endif %}{{ leak }}",
    "{% set ns = namespace(a=1, items=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }} {{ ns.items }}",
    "{% set ns = namespace({'k': 'v'}, z=2) %}{{ ns.k }}{{ ns.z }}{{ ns.nope }}|",
    "{% set block %}inner {{ num }}{% endset %}[{{ block }}]{% set up | upper %}abc{% endset %}{{ up }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Z') }}",
    "{% macro m() %}{{ later }}{% endmacro %}{% set later = 'seen' %}{{ m() }}",
    "{% filter upper %}shout {{ 'this' }}{% endfilter %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}|",
    "{% generation %}gen body{% endgeneration %}",
    "{{ strftime_now('%Y-%m') }} {{ strftime_now is defined }}",
    # tests
    "{{ num is defined }} {{ nope is undefined }} {{ none_v is none }} {{ 'a' is string }} {{ d is mapping }} {{ lst is sequence }} {{ 'a' is sequence }}",
    "{{ num is number }} {{ f is float }} {{ num is integer }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ lst is iterable }} {{ num is iterable }}",
    "{{ num is odd }} {{ num is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2 is eq 2 }} {{ 2 is ne 2 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }}",
    "{{ num is not none }} {{ none_v is not none }} {{ not num is defined }} {{ range is callable }} {{ none_v is sameas none }}",
    # filters
    "[{{ ws | trim }}] [{{ 'xxhixx' | trim('x') }}] {{ lst | length }} {{ 'héllo' | length }} {{ d | count }} {{ nope | length }}",
    "{{ 'AbC' | lower }} {{ 'abc' | upper }} {{ 'hello wORLD-foo(bar' | title }} {{ 'hELLO' | capitalize }} {{ uni | upper }} {{ uni | lower }} {{ uni | title }}",
    "{{ nope | default('dflt') }} {{ none_v | default('x') }} {{ '' | default('e', true) }} {{ 0 | d('zero', boolean=true) }} {{ nope | d }}|",
    "{{ lst | join(', ') }} {{ messages | map(attribute='role') | join }} {{ [1, none, 'x'] | join('-') }} {{ messages | join('|', attribute='role') }}",
    "{{ 'aXbXc' | replace('X', '.') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}",
    "{{ lst | first }} {{ lst | last }} {{ 'abc' | first }} {{ empty | first }}|{{ lst | list }} {{ 'ab' | list }} {{ d | list }}",
    "{{ num | string }} {{ none_v | string }} {{ '12' | int }} {{ '1.9' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.99 | int }} {{ '2.5' | float }} {{ 'q' | float }}",
    "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ uni | tojson }} {{ uni | tojson(ensure_ascii=true) }} {{ messages[2] | tojson(sort_keys=true) }}",
    "{{ d | tojson(separators=(',', ':')) }} {{ [1.0, 1e20, -0.0, 1.5e-7] | tojson }} {{ none_v | tojson }} {{ 'a\\u007fb' | tojson(ensure_ascii=true) }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('content') | list | length }}",
    "{{ messages | selectattr('name', 'defined') | list | length }} {{ messages | selectattr('name') | map(attribute='name') | first }}",
    "{{ [0, 1, '', 'a', none] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [1, 2, 3] | select('gt', 1) | list }}",
    "{{ d | items | list }} {{ d | dictsort }} {{ {'b': 1, 'A': 2} | dictsort }} {{ lst | sort }} {{ lst | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }}",
    "{{ messages | sort(attribute='role') | map(attribute='role') | list }} {{ [3, 1, 3, 'a', 'A'] | unique | list }} {{ lst | min }} {{ lst | max }} {{ lst | sum }}",
    "{{ lst | reverse | list }} {{ 'abc' | reverse }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x\\n\\ny' | indent(1, blank=true) }}",
    "{{ '<a href=\"x\">&</a>' | e }} {{ 'safe' | safe }} {{ 'one two  three' | wordcount }} {{ messages[1] | attr('role') }}|{{ messages[1] | attr('items') is callable }}",
    "{{ messages | map('tojson') | first }} {{ ['a', 'b'] | map('upper') | join }}",
    # string and dict methods
    "[{{ ws.strip() }}] [{{ ws.lstrip() }}] [{{ ws.rstrip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ 'abc'.rstrip('cb') }}]",
    "{{ s.split(',') }} {{ ws.split() }} {{ 'a b c'.split(' ', 1) }} {{ s.rsplit(',', 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'Hello'.lower() }} {{ 'Hello'.upper() }} {{ 'hello world'.title() }} {{ 'hELLo'.capitalize() }}",
    "{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'héllo'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ '  '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ ''.isdigit() }}",
    "{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 'dv') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}",
    "{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[2].content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
    # errors (Jinja raises; atlas must fail)
    "{{ raise_exception('custom failure message') }}",
    "{% if messages | length > 2 %}{{ raise_exception('Too many: ' ~ messages | length) }}{% endif %}",
    "{{ nope.attr }}",
    "{{ nope + 1 }}",
    "{{ 'a' + 1 }}",
    "{{ 1 / 0 }}",
    "{% for x in none_v %}{% endfor %}",
    "{{ 1 < 'a' }}",
    "{% set ns2 = 5 %}{% set ns2.x = 1 %}",
    "{% if true %}unclosed",
    "{% for x in lst %}{% endif %}",
    "{{ 'unterminated }}",
    "{{ 1 + }}",
    "{% endfor %}",
    "{{ lst.append(4) }}",
    "{{ d.update({}) }}",
    "{% include 'x.html' %}",
    "{{ x | nosuchfilter }}",
    "{{ 1 is nosuchtest }}",
    "{% nosuchtag %}",
    "{{ messages[0].content.nosuchmethod() }}",
]

# Jinja renders these, but only as text no template means: "<built-in method items of dict object
# at 0x7f...>" (a memory address). atlas refuses them with an error naming the line.
ATLAS_REFUSES = [
    "{{ d.items }}",
    "{{ 'x'.upper }}",
]


class GenerationBlock(jinja2.ext.Extension):
    """transformers' AssistantTracker as far as rendering goes: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def main():
    env = hf_env()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        os.makedirs(model)
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": KWARGS["bos_token"], "eos_token": KWARGS["eos_token"]}, f)
        msgs = os.path.join(tmp, "messages.json")
        with open(msgs, "w", encoding="utf-8") as f:
            json.dump({"messages": MESSAGES, "add_generation_prompt": True,
                       "kwargs": {k: v for k, v in KWARGS.items() if k not in ("bos_token", "eos_token")}}, f,
                      ensure_ascii=False)
        for i, snippet in enumerate(SNIPPETS + ATLAS_REFUSES):
            path = os.path.join(tmp, "t%03d.jinja" % i)
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(snippet)
            try:
                want = env.from_string(snippet).render(messages=MESSAGES, tools=None, documents=None,
                                                       add_generation_prompt=True, **KWARGS)
                want_err = None
            except jinja2.exceptions.TemplateError as e:
                want, want_err = None, e
            except (TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
                want, want_err = None, e
            r = subprocess.run([BIN, "render", "--model", model, "--template", path, "--messages", msgs],
                               capture_output=True)
            got = r.stdout.decode("utf-8", errors="replace")
            err = r.stderr.decode("utf-8", errors="replace")
            if snippet in ATLAS_REFUSES:
                ok = r.returncode != 0 and got == "" and "line 1" in err
                detail = "atlas should refuse: rc=%d out=%r err=%r" % (r.returncode, got, err.strip())
            elif want_err is None:
                ok = r.returncode == 0 and got == want
                detail = "want %r\n    got  %r %s" % (want, got, err.strip())
            else:
                # Fails too, with no output, naming the template line; raise_exception's text surfaces.
                ok = r.returncode != 0 and got == "" and "line " in err
                if type(want_err) is jinja2.exceptions.TemplateError and str(want_err) not in err:
                    ok = False
                detail = "jinja raised %s: %s\n    atlas: rc=%d out=%r err=%r" % (
                    type(want_err).__name__, want_err, r.returncode, got, err.strip())
            if not ok:
                failures += 1
                print("MISMATCH snippet %d: %r\n    %s" % (i, snippet, detail))
    n = len(SNIPPETS) + len(ATLAS_REFUSES)
    print("%d/%d snippets agree with jinja2 (or are refused as documented)" % (n - failures, n))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

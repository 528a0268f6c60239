"""`atlas analyze RUN` with the protocol's declared design and joined evaluator verdicts, end to end
on the tiny model (no shared data needed: inline texts and a small GSM8K file written here).

1. A trace protocol declaring [[edge]] and [[factorial]]: the frozen manifest carries them,
   analysis.json uses exactly those edges, and the factorial statistics (CV DiD, TV edge
   modulation) agree with a recomputation here from run.json's routes (1e-12). Without
   --manifest the default (every condition vs the first) is used and said so.
2. A generate protocol on a GSM8K file, `atlas eval`, then `atlas analyze --eval EVAL.json`:
   the correctness ledger equals the EVAL.json verdicts; with planted verdicts (the file's
   correctness edited, texts untouched) the per-edge paired correctness counts and contrasts and
   the source-blocked correctness agree with a recomputation here.
3. Bad input: an EVAL.json of another run or with another text, --eval on analysis-input files,
   a protocol edge naming an unknown condition: non-zero exit, file and field named, no output.
"""
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from atlas_cli import FAILS, atlas, check, load, dump  # noqa: E402


TMP = tempfile.mkdtemp(prefix="atlas-design-eval-")




def expect_error(what, pattern, out_dir, *args):
    p = atlas(*args, rc=None)
    check(p.returncode != 0 and re.search(pattern, p.stderr) is not None, f"{what}: error /{pattern}/ (got: {p.stderr.strip()})")
    check(not os.path.exists(out_dir), f"{what}: no output written")




CONDITIONS = """
[[condition]]
name = "s0_eos"
history = "filler"
group = "s0"

[[condition]]
name = "s1_eos"
system = true
history = "filler"
group = "s1"

[[condition]]
name = "s0_period"
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "." }]

[[condition]]
name = "s1_period"
system = true
history = "filler"
group = "s1"
edits = [{ anchor = "history_eos", to = "." }]
"""

DESIGN = """
[[edge]]
name = "system@eos"
condition = "s1_eos"
reference = "s0_eos"

[[edge]]
name = "system@period"
condition = "s1_period"
reference = "s0_period"

[[edge]]
condition = "s0_period"
reference = "s0_eos"

[[factorial]]
name = "system x period"
a = "system"
b = "period"
a0b0 = "s0_eos"
a1b0 = "s1_eos"
a0b1 = "s0_period"
a1b1 = "s1_period"
"""
EDGES = {"system@eos": ("s1_eos", "s0_eos"), "system@period": ("s1_period", "s0_period"),
         "s0_period vs s0_eos": ("s0_period", "s0_eos")}


def header(name, corpora, mode):
    return f"""
[protocol]
name = "{name}"

[model]
dir = "{TMP}/tiny"

[data]
root = "{TMP}/data"
{corpora}
[selection]
salt = "design-eval-test"
per_domain = 3

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 3
{CONDITIONS}
{DESIGN}
{mode}
[batching]
sources_per_batch = 3
"""


TRACE = header("design-trace", """
[[corpus]]
domain = "english"
format = "inline"
texts = ["The quick brown fox jumps over the lazy dog.", "Routing probes change one token.", "Experts receive tokens."]

[[corpus]]
domain = "code"
format = "inline"
texts = ["def add(a, b):\\n    return a + b\\n", "print(1 + 2)\\n", "x = [i * i for i in range(4)]\\n"]
""", """
[execution]
mode = "trace"
layers = ""
""")

GENERATE = header("design-generate", """
[[corpus]]
domain = "math"
format = "gsm8k"
path = "gsm8k.jsonl"
""", """
[execution]
mode = "generate"
max_new_tokens = 6
sampling = "greedy"
""")


def dist(cells, cond, li, E):
    cnt = [0] * E
    for c in cells:
        if c["condition"] != cond:
            continue
        lo, hi = c["interior_token_range"]
        for t in range(lo, hi):
            for e in c["result"]["routes"][li]["topk_ids"][t]:
                cnt[e] += 1
    n = sum(cnt)
    return [x / n for x in cnt]


def cv(p):
    m = sum(p) / len(p)
    return math.sqrt(sum((x - m) ** 2 for x in p) / len(p)) / m


def tv(p, q):
    return 0.5 * sum(abs(x - y) for x, y in zip(p, q))


def trace_part():
    proto = os.path.join(TMP, "trace.toml")
    with open(proto, "w") as f:
        f.write(TRACE)
    man = os.path.join(TMP, "trace_manifest.json")
    atlas("freeze", proto, "--out", man)
    m = load(man)
    check([e["name"] for e in m["protocol"]["edges"]] == list(EDGES), "manifest records the declared edges")
    check(m["protocol"]["factorials"][0]["a1b1"] == "s1_period", "manifest records the factorial")
    run = os.path.join(TMP, "trace_run")
    atlas("run", man, "--out", run)
    out = os.path.join(TMP, "trace_a")
    atlas("analyze", run, "--manifest", man, "--out", out, "--replicates", "30", "--task-replicates", "10")
    a = load(os.path.join(out, "analysis.json"))
    check(a["design"]["origin"].startswith("declared in the protocol"), f"design origin: {a['design']['origin']}")
    check({e["name"]: (e["condition"], e["reference"]) for e in a["design"]["edges"]} == EDGES, "design edges")
    got_edges = {r["edge"] for r in a["routing"]["stats"] if "edge" in r}
    check(got_edges == set(EDGES), f"routing stats use exactly the declared edges: {sorted(got_edges)}")
    cells = load(os.path.join(run, "run.json"))["cells"]
    E = a["routing"]["experts"]
    layers = [str(r["layer"]) for r in cells[0]["result"]["routes"]]
    n_checked, moved = 0, 0
    for li, l in enumerate(layers):
        d = {k: dist(cells, c, li, E) for k, c in
             {(0, 0): "s0_eos", (1, 0): "s1_eos", (0, 1): "s0_period", (1, 1): "s1_period"}.items()}
        c = {k: cv(v) for k, v in d.items()}
        want = {"cv_did": (c[1, 1] - c[0, 1]) - (c[1, 0] - c[0, 0]),
                "cv_main_a": 0.5 * ((c[1, 0] - c[0, 0]) + (c[1, 1] - c[0, 1])),
                "tv_a_edge_modulation": tv(d[1, 1], d[0, 1]) - tv(d[1, 0], d[0, 0]),
                "tv_b_edge_modulation": tv(d[1, 1], d[1, 0]) - tv(d[0, 1], d[0, 0])}
        for metric, v in want.items():
            rows = [r for r in a["routing"]["stats"] if r["metric"] == metric and str(r["layer"]) == l and
                    r["domain"] == "all" and r["scope"] == "target" and r["kind"] == "count" and r["aggregation"] == "token"
                    and r.get("factorial") == "system x period"]
            if len(rows) != 1 or abs(rows[0]["value"] - v) > 1e-12:
                check(False, f"layer {l} {metric}: {rows} vs {v}")
            else:
                n_checked += 1
                moved += v != 0
                if not rows[0]["ci"] or not rows[0]["ci"][0] <= rows[0]["ci"][1]:
                    check(False, f"layer {l} {metric}: interval {rows[0]['ci']}")
    check(n_checked == 4 * len(layers) and moved > 0, f"factorial statistics match the recomputation ({n_checked}, {moved} nonzero)")
    # Without --manifest: the default edges, stated.
    out2 = os.path.join(TMP, "trace_b")
    atlas("analyze", run, "--out", out2, "--replicates", "10", "--task-replicates", "10")
    b = load(os.path.join(out2, "analysis.json"))
    check(b["design"]["origin"].startswith("default: every condition vs the first condition (no --manifest given"),
          f"default origin: {b['design']['origin']}")
    check([e["name"] for e in b["design"]["edges"]] == ["s1_eos vs s0_eos", "s0_period vs s0_eos", "s1_period vs s0_eos"],
          "default edges")
    return man


def generate_part(trace_manifest):
    os.makedirs(os.path.join(TMP, "data"), exist_ok=True)
    with open(os.path.join(TMP, "data", "gsm8k.jsonl"), "w") as f:
        for q, a in [("Tom has 3 apples and buys 4 more. How many apples?", 7), ("What is 6 times 7?", 42),
                     ("A box holds 5 pens. How many pens in 3 boxes?", 15), ("Sam had 10 coins and lost 4. How many?", 6)]:
            f.write(json.dumps({"question": q, "answer": f"Work.\n#### {a}"}) + "\n")
    proto = os.path.join(TMP, "gen.toml")
    with open(proto, "w") as f:
        f.write(GENERATE)
    man = os.path.join(TMP, "gen_manifest.json")
    atlas("freeze", proto, "--out", man)
    run = os.path.join(TMP, "gen_run")
    atlas("run", man, "--out", run)
    ev_path = os.path.join(TMP, "EVAL.json")
    atlas("eval", os.path.join(run, "run.json"), "--manifest", man, "--out", ev_path)
    ev = load(ev_path)
    out = os.path.join(TMP, "gen_a")
    atlas("analyze", run, "--manifest", man, "--eval", ev_path, "--out", out, "--replicates", "50", "--task-replicates", "50")
    a = load(os.path.join(out, "analysis.json"))
    check(a["eval"]["cells_with_verdict_record"] == len(ev["cells"]) and a["eval"]["mismatched_cells"] == 0,
          f"eval join: {a['eval']}")
    with open(ev_path, "rb") as f:
        ev_sha = hashlib.sha256(f.read()).hexdigest()
    check(any(i.get("role") == "evaluation" and i["sha256"] == ev_sha and
              os.path.normpath(os.path.join(out, i["path"])) == os.path.normpath(ev_path) for i in a["inputs"]),
          "EVAL.json listed in inputs (role evaluation) with its hash")
    for lg in a["outputs"]["ledgers"]:
        if lg["domain"] != "math":
            continue
        sel = [c for c in ev["cells"] if lg["condition"] in ("all", c["condition"])]
        want = {"correct": sum(c["correctness"] == "correct" for c in sel),
                "incorrect": sum(c["correctness"] == "incorrect" for c in sel),
                "unknown": sum(c["correctness"] == "not_evaluated" for c in sel)}
        check(lg["correctness"] == want, f"correctness ledger {lg['condition']}: {lg['correctness']} vs {want}")
        tw = {}
        for c in sel:
            tw[c["terminal"]["state"]] = tw.get(c["terminal"]["state"], 0) + 1
        check(lg["terminal"] == tw, f"terminal ledger {lg['condition']}: {lg['terminal']} vs {tw}")

    # Planted verdicts: a known pattern of correct / incorrect / not evaluated.
    planted = json.loads(json.dumps(ev))
    pattern = ["correct", "incorrect", "correct", "not_evaluated", "incorrect", "correct", "correct"]
    for i, c in enumerate(planted["cells"]):
        c["correctness"] = pattern[i % len(pattern)]
        c["coverage"]["evaluated"] = c["correctness"] != "not_evaluated"
    pl_path = os.path.join(TMP, "EVAL_planted.json")
    dump(planted, pl_path)
    out = os.path.join(TMP, "gen_planted")
    atlas("analyze", run, "--manifest", man, "--eval", pl_path, "--out", out, "--replicates", "50", "--task-replicates", "50")
    a = load(os.path.join(out, "analysis.json"))
    verdict = {c["cell_id"]: c["correctness"] for c in planted["cells"]}
    run_cells = load(os.path.join(run, "run.json"))["cells"]
    by = {(c["source_key"], c["condition"]): verdict[c["cell_id"]] for c in run_cells}
    sources = sorted({c["source_key"] for c in run_cells})
    n_checked = 0
    for name, (x, y) in EDGES.items():
        pairs = [(by[s, x] == "correct", by[s, y] == "correct") for s in sources
                 if by[s, x] != "not_evaluated" and by[s, y] != "not_evaluated"]
        rows = [r for r in a["outputs"]["stats"] if r["metric"] == "correct_rate_difference" and r["edge"] == name
                and r["domain"] == "math"]
        want = (len(pairs), sum(p and q for p, q in pairs), sum(p and not q for p, q in pairs),
                sum(q and not p for p, q in pairs))
        r = rows[0] if len(rows) == 1 else {}
        got = (r.get("pairs"), r.get("both_correct"), r.get("condition_only"), r.get("reference_only"))
        diff = (want[2] - want[3]) / want[0] if want[0] else None
        ok = got == want and (r.get("value") == diff if diff is None else abs(r.get("value") - diff) <= 1e-12)
        # Source-blocked correctness contrast (one repeat per source: the per-source difference).
        sb = [row for row in a["tasks"]["stats"] if row["metric"] == "source_blocked_correct" and row["edge"] == name
              and row["domain"] == "math"]
        sbw = [float(p) - float(q) for p, q in pairs]
        ok = ok and len(sb) == 1 and (abs(sb[0]["value"] - sum(sbw) / len(sbw)) <= 1e-12 if sbw else sb[0]["value"] is None)
        check(ok, f"edge {name}: correctness {got} vs {want}, difference {r.get('value')} vs {diff}")
        n_checked += 1
    check(n_checked == 3, "every declared edge has a correctness contrast")

    # Bad input.
    other = json.loads(json.dumps(ev))
    other["run"]["content_sha256"] = "0" * 64
    other_path = os.path.join(TMP, "EVAL_other.json")
    dump(other, other_path)
    expect_error("EVAL.json of another run", r"EVAL_other\.json: run\.content_sha256: .*--allow-mixed", os.path.join(TMP, "bad1"),
                 "analyze", run, "--manifest", man, "--eval", other_path, "--out", os.path.join(TMP, "bad1"))
    out = os.path.join(TMP, "allowed")
    atlas("analyze", run, "--manifest", man, "--eval", other_path, "--allow-mixed", "--out", out, "--replicates", "10",
          "--task-replicates", "10")
    al = load(os.path.join(out, "analysis.json"))
    check(al["eval"]["files"][0]["run_content_sha256_matches"] is False and al["eval"]["allow_mismatch"] is True,
          "--allow-mixed joins it and records the mismatch")
    text = json.loads(json.dumps(ev))
    text["cells"][1]["text_sha256"] = "f" * 64
    text_path = os.path.join(TMP, "EVAL_text.json")
    dump(text, text_path)
    expect_error("EVAL.json judging another text", r"EVAL_text\.json: cells\[1\]\.text_sha256: cell .*not the run's",
                 os.path.join(TMP, "bad2"), "analyze", run, "--manifest", man, "--eval", text_path, "--out", os.path.join(TMP, "bad2"))
    expect_error("EVAL.json of another manifest", r"EVAL\.json: run\.manifest_sha256: is ", os.path.join(TMP, "bad3"),
                 "analyze", os.path.join(TMP, "trace_run"), "--manifest", trace_manifest, "--eval", ev_path, "--out",
                 os.path.join(TMP, "bad3"))
    inp = os.path.join(TMP, "input.json")
    dump({"format": "atlas-analysis-input-v1", "conditions": ["a"], "sources": [{"id": "s", "domain": "d"}],
          "cells": [{"source": "s", "condition": "a", "generated_ids": [1]}]}, inp)
    expect_error("--eval with an analysis-input file", r"--eval: .*probe run artifacts only", os.path.join(TMP, "bad4"),
                 "analyze", inp, "--eval", ev_path, "--out", os.path.join(TMP, "bad4"))


def bad_protocol():
    proto = os.path.join(TMP, "bad.toml")
    with open(proto, "w") as f:
        f.write(TRACE.replace('reference = "s0_period"', 'reference = "s0_dot"'))
    out = os.path.join(TMP, "bad_manifest.json")
    expect_error("protocol edge with an unknown condition", r"bad\.toml: edge\[1\]\.reference: unknown condition 's0_dot'", out,
                 "freeze", proto, "--out", out)


try:
    atlas("make-model", "--preset", "tiny", "--seed", "0", os.path.join(TMP, "tiny"))
    tm = trace_part()
    generate_part(tm)
    bad_protocol()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
print(f"{len(FAILS)} failed")
sys.exit(1 if FAILS else 0)

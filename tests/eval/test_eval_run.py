"""`atlas eval RUN_ARTIFACT` end to end: the tiny model generates for 2 GSM8K and 2 HumanEval
sources, then the ledgers must add up (every cell once per ledger, per domain and overall), the
gold and stop reasons must match what is read here independently from the corpus and the run,
planted completions (the canonical solution, "The answer is <gold>.") must score as correct,
the output must be byte-identical outside "runtime" on a rerun, and bad input must fail
cleanly (non-zero exit, the file and field named, no output file).

Skips (exit 77) when ../shared/data or bubblewrap is absent.
"""
import copy
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from atlas_cli import FAILS, atlas, check, load, dump  # noqa: E402


SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
DATA = os.path.normpath(os.path.join(SRC, "..", "shared", "data"))
if not os.path.isdir(DATA):
    DATA = "/work/shared/data"


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


if not os.path.isfile(os.path.join(DATA, "gsm8k", "test.jsonl")) or not os.path.isfile(
        os.path.join(DATA, "humaneval", "HumanEval.jsonl.gz")):
    skip("no ../shared/data")
if shutil.which("bwrap") is None:
    skip("bubblewrap (bwrap) not installed")

TMP = tempfile.mkdtemp(prefix="atlas-evalrun-")






PROTO = f"""
[protocol]
name = "eval-run-test"

[model]
dir = "{TMP}/tiny"

[data]
root = "{DATA}"

[[corpus]]
domain = "math"
format = "gsm8k"
path = "gsm8k/test.jsonl"

[[corpus]]
domain = "code"
format = "humaneval"
path = "humaneval/HumanEval.jsonl.gz"

[selection]
salt = "eval-run-test"
per_domain = 2
content_tokens = [0]

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 3

[[condition]]
name = "s0_eos"
history = "filler"
group = "s0"

[execution]
mode = "generate"
max_new_tokens = 4
sampling = "greedy"

[batching]
sources_per_batch = 2
"""

LEDGERS = ("stopping", "terminal", "coverage", "correctness")


def gsm8k_gold(line_index):
    with open(os.path.join(DATA, "gsm8k", "test.jsonl")) as f:
        for i, line in enumerate(f):
            if i == line_index:
                ans = json.loads(line)["answer"]
                return ans.rsplit("####", 1)[1].strip().replace(",", "")
    raise KeyError(line_index)


def humaneval_tasks():
    with gzip.open(os.path.join(DATA, "humaneval", "HumanEval.jsonl.gz"), "rt") as f:
        return {t["task_id"]: t for t in map(json.loads, f)}


def without_runtime(path):
    with open(path, "rb") as f:
        a = json.loads(f.read())
    a.pop("runtime")
    return json.dumps(a, sort_keys=False)


def check_ledgers(ev, run_cells):
    n = len(run_cells)
    led = ev["ledgers"]
    check(led["cells"] == n, f"ledgers.cells {led['cells']} != {n} run cells")
    check(len(ev["cells"]) == n, "one result per run cell")
    for name in LEDGERS:
        check(sum(led[name].values()) == n, f"ledger {name} sums to {sum(led[name].values())}, not {n}")
        # Recount from the per-cell results: every cell in exactly one category.
        counts = {}
        for c in ev["cells"]:
            k = {"stopping": c["stop"], "terminal": c["terminal"]["state"],
                 "coverage": "evaluated" if c["coverage"]["evaluated"] else "not_evaluated",
                 "correctness": c["correctness"]}[name]
            counts[k] = counts.get(k, 0) + 1
        check(all(led[name].get(k) == v for k, v in counts.items()), f"ledger {name} {led[name]} != recount {counts}")
    for dom in ("math", "code"):
        nd = sum(1 for c in run_cells if c["domain"] == dom)
        check(nd == 2, f"{nd} {dom} cells, want 2")
        for name in LEDGERS:
            check(sum(led["by_domain"][dom][name].values()) == nd, f"by_domain {dom} {name} does not sum to {nd}")
    for c in ev["cells"]:
        # A cell not evaluated is never counted correct or incorrect, and vice versa.
        check(c["coverage"]["evaluated"] == (c["correctness"] != "not_evaluated"), f"{c['cell_id']}: coverage vs correctness")


def main():
    atlas("make-model", "--preset", "tiny", "--seed", "0", os.path.join(TMP, "tiny"))
    proto = os.path.join(TMP, "p.toml")
    with open(proto, "w") as f:
        f.write(PROTO)
    man = os.path.join(TMP, "manifest.json")
    atlas("freeze", proto, "--out", man)
    rundir = os.path.join(TMP, "run")
    atlas("run", man, "--out", rundir)
    run_path = os.path.join(rundir, "run.json")
    run = load(run_path)

    out = os.path.join(TMP, "eval.json")
    atlas("eval", run_path, "--manifest", man, "--out", out, "--workers", "2")
    ev = load(out)
    check(ev["kind"] == "atlas.eval", "kind")
    with open(run_path, "rb") as f:
        run_sha = hashlib.sha256(f.read()).hexdigest()
    check(any(r["sha256"] == run_sha and r["path"].endswith("run.json") for r in ev["inputs"]),
          "inputs record the run artifact's SHA-256")
    check("runtime" in ev, "runtime section")
    check_ledgers(ev, run["cells"])
    by_id = {c["cell_id"]: c for c in run["cells"]}
    for c in ev["cells"]:
        rc = by_id[c["cell_id"]]
        check(c["stop"] == rc["result"]["stop"], f"{c['cell_id']}: stop copied from the run")
        if c["domain"] == "math" and "gsm8k" in c:  # absent when the tiny model's ids have no text
            check(c["gsm8k"]["gold"] == gsm8k_gold(int(c["source_id"])), f"{c['cell_id']}: gold from the corpus")

    # Rerun: byte-identical outside runtime.
    out2 = os.path.join(TMP, "eval2.json")
    atlas("eval", run_path, "--manifest", man, "--out", out2, "--workers", "1")
    check(without_runtime(out) == without_runtime(out2), "rerun differs outside runtime")

    # Planted completions: correct answers must be scored correct, a truncated one must not be.
    tasks = humaneval_tasks()
    planted = copy.deepcopy(run)
    code = [c for c in planted["cells"] if c["domain"] == "code"]
    math = [c for c in planted["cells"] if c["domain"] == "math"]
    code[0]["result"].update(text=tasks[code[0]["source_id"]]["canonical_solution"], stop="eos")
    code[1]["result"].update(text="```python\ndef broken(:\n```", stop="eos")
    g0, g1 = gsm8k_gold(int(math[0]["source_id"])), gsm8k_gold(int(math[1]["source_id"]))
    math[0]["result"].update(text=f"Step by step. The answer is {g0}.", stop="eos")
    math[1]["result"].update(text=f"The answer is {g1}", stop="length")
    pl_path = os.path.join(rundir, "planted.json")
    dump(planted, pl_path)
    out3 = os.path.join(TMP, "eval3.json")
    atlas("eval", pl_path, "--manifest", man, "--out", out3, "--workers", "2")
    ev3 = load(out3)
    check_ledgers(ev3, planted["cells"])
    r = {c["cell_id"]: c for c in ev3["cells"]}
    c0, c1, m0, m1 = (r[x["cell_id"]] for x in (code[0], code[1], math[0], math[1]))
    check(m0["gsm8k"]["gold"] == g0 and m1["gsm8k"]["gold"] == g1, "planted: gold from the corpus")
    check(c0["humaneval"]["task_id"] == code[0]["source_id"], "planted: the cell's task")
    check(c0["correctness"] == "correct" and c0["terminal"]["state"] == "parses", f"canonical solution: {c0}")
    check(c1["terminal"]["state"] == "syntax_error" and not c1["coverage"]["evaluated"]
          and c1["correctness"] == "not_evaluated", f"broken program: {c1}")
    check(m0["correctness"] == "correct" and m0["terminal"]["state"] == "final_marker", f"gold answer at EOS: {m0}")
    check(m1["correctness"] == "incorrect" and m1["terminal"]["state"] == "final_marker" and m1["stop"] == "length"
          and m1["gsm8k"]["matches_gold"], f"gold answer cut at length: {m1}")

    # Bad input: non-zero exit, the file and field named, no output.
    def bad(doc, want, name):
        p_in = os.path.join(rundir, name + ".json")
        dump(doc, p_in)
        p_out = os.path.join(TMP, name + "-eval.json")
        p = atlas("eval", p_in, "--manifest", man, "--out", p_out, rc=None)
        check(p.returncode != 0, f"{name}: exit {p.returncode}")
        check(p_in in p.stderr and want in p.stderr, f"{name}: error names file and {want!r}: {p.stderr!r}")
        check(not os.path.exists(p_out), f"{name}: no output file")

    trace = copy.deepcopy(run)
    trace["execution"]["mode"] = "trace"
    bad(trace, "execution.mode", "trace")
    unknown = copy.deepcopy(run)
    unknown["cells"][1]["domain"] = "poetry"
    bad(unknown, "cells[1].domain", "unknown")
    nostop = copy.deepcopy(run)
    nostop["cells"][0]["result"]["stop"] = "maybe"
    bad(nostop, "cells[0].result.stop", "nostop")
    # A run of another manifest.
    other = copy.deepcopy(run)
    other["manifest_sha256"] = "0" * 64
    bad(other, "manifest_sha256", "other")

    shutil.rmtree(TMP, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} failure(s)")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()

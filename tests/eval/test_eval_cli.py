"""CLI tests for `atlas humaneval` and `atlas gsm8k`: outputs, summaries, determinism, and bad
input (one clear error naming the file/line/field, non-zero exit, no output file).

Uses the real data under ../shared/data when present (skips visibly, exit 77, otherwise).
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

ATLAS = os.environ["ATLAS_BIN"]
SRC = os.environ["ATLAS_SOURCE_DIR"]


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


def find_data():
    d = os.path.abspath(SRC)
    while True:
        cand = os.path.join(d, "shared", "data")
        if os.path.isdir(cand):
            return cand
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def run(*args):
    return subprocess.run([ATLAS, *args], capture_output=True, text=True)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def expect_error(args, out, *needles):
    r = run(*args)
    assert r.returncode != 0, (args, r.stdout)
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert not os.path.exists(out), out
    return r


def main():
    data = find_data()
    if not data:
        skip("../shared/data not found")
    he = os.path.join(data, "humaneval", "HumanEval.jsonl.gz")
    gsm = os.path.join(data, "gsm8k", "test.jsonl")
    if not (os.path.exists(he) and os.path.exists(gsm)):
        skip("HumanEval or GSM8K data absent")
    with gzip.open(he, "rt") as f:
        problems = [json.loads(line) for line in f]
    by_id = {p["task_id"]: p for p in problems}

    tmp = tempfile.mkdtemp(prefix="atlas-eval-cli-")
    samples = os.path.join(tmp, "he.jsonl")
    out = os.path.join(tmp, "he_out.jsonl")
    p0, p1, p2 = problems[0], problems[1], problems[2]
    fenced = "Here you go:\n```python\n" + p2["prompt"].split('"""')[0].rstrip() + "\n    return number % 1.0\n```\n"
    rows = [
        {"task_id": p0["task_id"], "completion": p0["canonical_solution"], "extra": 1},
        {"task_id": p1["task_id"], "completion": "    return []\n"},
        {"task_id": p2["task_id"], "completion": fenced},
        {"task_id": p2["task_id"], "completion": "    return 1 / 0\n"},
        {"task_id": p2["task_id"], "completion": "    return (\n"},
        {"task_id": p2["task_id"], "completion": "```python\ndef truncate_number(x):\n"},
        {"task_id": p0["task_id"], "completion": p0["canonical_solution"]},
    ]
    write_jsonl(samples, rows)
    r = run("humaneval", "--problems", he, "--samples", samples, "--out", out, "--timeout", "5")
    assert r.returncode == 0, r.stderr
    res = read_jsonl(out)
    assert [x["result"] for x in res] == ["passed", "assertion_failed", "passed", "runtime_error",
                                          "syntax_error", "not_run", "passed"], res
    assert res[0]["extra"] == 1 and res[0]["completion"] == rows[0]["completion"]
    assert res[2]["extraction"] == "fenced_function", res[2]
    assert res[3]["exception"] == "ZeroDivisionError"
    assert res[5]["detail"] == "unclosed code fence"
    assert "passed            3" in r.stdout and "pass rate         3/7" in r.stdout, r.stdout
    # Deterministic output: a second run (fresh sandboxes) gives the same bytes.
    out2 = os.path.join(tmp, "he_out2.jsonl")
    assert run("humaneval", "--problems", he, "--samples", samples, "--out", out2).returncode == 0
    assert open(out, "rb").read() == open(out2, "rb").read()

    # Bad input.
    expect_error(["humaneval", "--problems", os.path.join(tmp, "missing.jsonl.gz"), "--samples", samples,
                  "--out", out + ".x"], out + ".x", "missing.jsonl.gz")
    bad = os.path.join(tmp, "bad.jsonl")
    write_jsonl(bad, [{"task_id": p0["task_id"], "completion": ""}, {"task_id": "HumanEval/9999", "completion": ""}])
    expect_error(["humaneval", "--problems", he, "--samples", bad, "--out", out + ".x"], out + ".x",
                 "bad.jsonl", "line 2", "task_id", "HumanEval/9999")
    with open(bad, "w") as f:
        f.write(json.dumps({"task_id": p0["task_id"], "completion": ""}) + "\n{not json\n")
    expect_error(["humaneval", "--problems", he, "--samples", bad, "--out", out + ".x"], out + ".x",
                 "bad.jsonl", "line 2", "malformed")
    write_jsonl(bad, [{"task_id": p0["task_id"]}])
    expect_error(["humaneval", "--problems", he, "--samples", bad, "--out", out + ".x"], out + ".x",
                 "line 1", "completion")
    trunc = os.path.join(tmp, "trunc.jsonl.gz")
    with open(he, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read()[:5000])
    expect_error(["humaneval", "--problems", trunc, "--samples", samples, "--out", out + ".x"], out + ".x",
                 "trunc.jsonl.gz")
    expect_error(["humaneval", "--problems", he, "--samples", samples, "--out", out + ".x", "--bwrap",
                  "/nonexistent/bwrap"], out + ".x", "bubblewrap")

    # GSM8K.
    with open(gsm) as f:
        gold = [json.loads(line)["answer"].split("####")[-1].strip().replace(",", "") for line in f]
    gs = os.path.join(tmp, "gsm.jsonl")
    gout = os.path.join(tmp, "gsm_out.jsonl")
    grow = [
        {"index": 0, "completion": "She makes 9 * 2 = 18.\n\\boxed{" + gold[0] + "}", "stop": "eos"},
        {"index": 1, "completion": "The answer is " + gold[1] + ".", "stop": "length"},
        {"index": 2, "completion": "so it is " + gold[2], "stop": "eos"},
        {"index": 3, "completion": "The answer is 123456789.", "stop": "eos"},
        {"index": 4, "completion": "no idea", "stop": "eos"},
    ]
    write_jsonl(gs, grow)
    r = run("gsm8k", "--problems", gsm, "--samples", gs, "--out", gout)
    assert r.returncode == 0, r.stderr
    g = read_jsonl(gout)
    assert [x["method"] for x in g] == ["boxed", "phrase", "last_number", "phrase", "none"], g
    assert [x["strict_complete"] for x in g] == [True, False, False, True, False]
    assert [x["exact"] for x in g] == [True, False, False, False, False]
    assert [x["matches_gold"] for x in g] == [True, True, True, False, False]
    assert g[0]["gold"] == gold[0] and g[4]["extracted"] is None
    assert "strict exact        1/5" in r.stdout, r.stdout

    write_jsonl(gs, [{"index": 0, "completion": "x", "stop": "eos"}, {"index": 5000, "completion": "x", "stop": "eos"}])
    expect_error(["gsm8k", "--problems", gsm, "--samples", gs, "--out", gout + ".x"], gout + ".x",
                 "gsm.jsonl", "line 2", "index", "out of range")
    write_jsonl(gs, [{"index": 0, "completion": "x", "stop": "max_tokens"}])
    expect_error(["gsm8k", "--problems", gsm, "--samples", gs, "--out", gout + ".x"], gout + ".x",
                 "line 1", "stop")
    badp = os.path.join(tmp, "badp.jsonl")
    write_jsonl(badp, [{"question": "q", "answer": "#### 4"}, {"question": "q", "answer": "no marks"}])
    expect_error(["gsm8k", "--problems", badp, "--samples", gs, "--out", gout + ".x"], gout + ".x",
                 "badp.jsonl", "line 2", "answer")
    for verb in ("humaneval", "gsm8k"):
        r = run(verb, "--help")
        assert r.returncode == 0 and "--samples" in r.stdout
    print("ok")


if __name__ == "__main__":
    main()

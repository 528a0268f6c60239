#!/usr/bin/env bash
# atlas bench on the tiny checkpoint (CPU; the figures themselves are not checked, only what the
# records say): every workload gives one record per mode with the issue's fields; a reference
# file's figure is carried into its record with the ratio; the seed grid's tokens equal an
# independent `atlas generate` of the saved prompts; bad flags and a bad reference are clear
# errors with no output file.
source "$(dirname "$0")/../cli/lib.sh"
model="$work/tiny"
py=/usr/bin/python3
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
small=(--grid-prompts 3 --grid-new-tokens 5 --decode-steps 4 --mem-prefill 20 --mem-steps 2)

"$bin" bench --model "$model" --backend cpu "${small[@]}" --save-prompts "$work/p.json" >/dev/null 2>&1 \
  && [[ -s "$work/p.json" ]] && ok "prompts saved" || bad "save prompts"
# A reference as bench_transformers.py writes it (values are arbitrary: only carried over).
cat >"$work/ref.json" <<'J'
{"reference": "test", "records": [{"workload": "decode-b1", "value": 2.0, "unit": "tok/s"},
 {"workload": "seed-grid-128x512", "value": 100.0, "unit": "s"}]}
J
"$bin" bench --model "$model" --backend cpu "${small[@]}" --reference "$work/ref.json" --json "$work/b.json" \
  >"$work/out" 2>"$work/err" && ok "bench ran" || bad "bench: $(cat "$work/err")"
$py - "$work/b.json" "$work/ref.json" <<'PY' && ok "records well formed, reference named by file, hash and date" || bad "records"
import json, sys
r = json.load(open(sys.argv[1]))
names = {"load", "seed-grid-128x512", "prefill-trace-128", "decode-b1", "peak-mem-128x1024"}
assert {x["workload"] for x in r} == names, [x["workload"] for x in r]
for x in r:
    for k in ("workload", "mode", "atlas", "reference", "unit", "gpu", "commit", "date", "command"):
        assert k in x, (k, x)
    assert x["mode"] == "batch-invariant"
    assert x["atlas"] > 0 or x["workload"] == "peak-mem-128x1024", x
    assert "bench" in x["command"]
by = {x["workload"]: x for x in r}
assert by["decode-b1"]["reference"] == 2.0 and by["decode-b1"]["unit"] == "tok/s"
assert abs(by["decode-b1"]["speedup_vs_reference"] - by["decode-b1"]["atlas"] / 2.0) < 1e-9
assert abs(by["seed-grid-128x512"]["speedup_vs_reference"] - 100.0 / by["seed-grid-128x512"]["atlas"]) < 1e-9
assert by["load"]["reference"] is None
assert by["seed-grid-128x512"]["detail"]["new_tokens"] == 3 * 5
assert by["prefill-trace-128"]["detail"]["stages"] > 2
# Which reference run: the file and its hash, its own name, device and date (none here).
import hashlib
ref = sys.argv[2]
for x in r:
    src = x["reference_source"]
    assert src["file"] == ref and src["sha256"] == hashlib.sha256(open(ref, "rb").read()).hexdigest(), src
    assert src["name"] == "test" and src["device"] is None and src["date"] is None, src
    assert "same machine" not in x["reference_name"], x["reference_name"]
PY
# The grid's greedy tokens are what `atlas generate` gives for the same prompts.
$py - "$work/p.json" "$work/prompts.jsonl" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    for i, ids in enumerate(p["prompts"]):
        f.write(json.dumps({"id": str(i), "ids": ids}) + "\n")
PY
"$bin" generate --model "$model" --backend cpu --compute bf16 --prompts "$work/prompts.jsonl" --out "$work/g.jsonl" \
  --max-new-tokens 5 --greedy --batch 3 >/dev/null 2>&1 || bad "generate"
$py - "$work/g.jsonl" "$work/b.json" <<'PY' && ok "grid tokens equal atlas generate" || bad "grid tokens differ from generate"
import hashlib, json, struct, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
h = hashlib.sha256()
for r in rows:
    h.update(struct.pack("<%di" % len(r["ids"]), *r["ids"]))
b = {x["workload"]: x for x in json.load(open(sys.argv[2]))}
assert b["seed-grid-128x512"]["detail"]["tokens_sha256"] == h.hexdigest()
PY

# --repeat: each timed workload runs N times on the loaded model; the record keeps the median and
# every run, and the runs' fingerprints (tokens, stage hashes) agree.
"$bin" bench --model "$model" --backend cpu "${small[@]}" --repeat 3 --workload seed-grid-128x512 \
  --workload prefill-trace-128 --workload decode-b1 --json "$work/r.json" >/dev/null 2>"$work/err" \
  && ok "bench --repeat ran" || bad "bench --repeat: $(cat "$work/err")"
$py - "$work/r.json" "$work/b.json" <<'PY' && ok "repeated records: median of 3 runs, fingerprints identical" || bad "repeated records"
import json, statistics, sys
r = {x["workload"]: x for x in json.load(open(sys.argv[1]))}
once = {x["workload"]: x for x in json.load(open(sys.argv[2]))}
assert set(r) == {"seed-grid-128x512", "prefill-trace-128", "decode-b1"}, list(r)
for w, x in r.items():
    d = x["detail"]
    assert len(d["runs"]) == 3 and all(v > 0 for v in d["runs"]), (w, d)
    assert abs(x["atlas"] - statistics.median(d["runs"])) < 1e-12, (w, x["atlas"], d["runs"])
    assert d["statistic"] == "median of 3 runs", d
    assert d["fingerprint_identical_across_runs"] is True, (w, d)
# The same fingerprints as the single-run bench above (same prompts, same model).
assert r["seed-grid-128x512"]["detail"]["tokens_sha256"] == once["seed-grid-128x512"]["detail"]["tokens_sha256"]
assert r["decode-b1"]["detail"]["tokens_sha256"] == once["decode-b1"]["detail"]["tokens_sha256"]
assert r["prefill-trace-128"]["detail"]["stage_hashes_sha256"] == once["prefill-trace-128"]["detail"]["stage_hashes_sha256"]
g = r["seed-grid-128x512"]
assert abs(g["detail"]["tokens_per_s"] - g["detail"]["new_tokens"] / g["atlas"]) < 1e-9
# A single run has no runs list; no --reference, no reference source.
assert "runs" not in once["seed-grid-128x512"]["detail"]
assert all(x["reference_source"] is None and x["reference"] is None for x in r.values())
PY
# --intervene: the timed workloads run with the edits (the record's figure) and without them
# (detail.unedited_*); the unedited fingerprints are the plain bench's, the edited grid's and
# decode's tokens are what `atlas generate --intervene` gives for the same prompts.
edits=(--intervene 'blocks.1.moe.experts.3=route-out' --intervene 'blocks.0.hook_resid_post@2-5=scale:0.5')
"$bin" bench --model "$model" --backend cpu "${small[@]}" --repeat 2 --workload seed-grid-128x512 \
  --workload prefill-trace-128 --workload decode-b1 "${edits[@]}" --json "$work/e.json" >/dev/null 2>"$work/err" \
  && ok "bench --intervene ran" || bad "bench --intervene: $(cat "$work/err")"
"$bin" generate --model "$model" --backend cpu --compute bf16 --prompts "$work/prompts.jsonl" --out "$work/ge.jsonl" \
  --max-new-tokens 5 --greedy --batch 3 "${edits[@]}" >/dev/null 2>&1 || bad "generate --intervene"
$py - "$work/p.json" "$work/d.jsonl" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
open(sys.argv[2], "w").write(json.dumps({"id": "d", "ids": p["decode_prompt"]}) + "\n")
PY
"$bin" generate --model "$model" --backend cpu --compute bf16 --prompts "$work/d.jsonl" --out "$work/gd.jsonl" \
  --max-new-tokens 5 --greedy "${edits[@]}" >/dev/null 2>&1 || bad "generate --intervene (decode prompt)"
$py - "$work/e.json" "$work/r.json" "$work/b.json" "$work/ge.jsonl" "$work/gd.jsonl" <<'PY' \
  && ok "edited records: edits named, unedited runs = the plain bench, edited tokens = generate --intervene" \
  || bad "edited records"
import hashlib, json, struct, sys
e = {x["workload"]: x for x in json.load(open(sys.argv[1]))}
plain = {x["workload"]: x for x in json.load(open(sys.argv[2]))}
assert all("interventions" not in x for x in json.load(open(sys.argv[3])))  # absent without edits
fp = {"seed-grid-128x512": "tokens_sha256", "prefill-trace-128": "stage_hashes_sha256", "decode-b1": "tokens_sha256"}
for w, x in e.items():
    d = x["detail"]
    assert [i["spec"] for i in x["interventions"]] == ["blocks.1.moe.experts.3=route-out",
                                                       "blocks.0.hook_resid_post@2-5=scale:0.5"], x["interventions"]
    assert d["unedited_" + fp[w]] == plain[w]["detail"][fp[w]], w
    assert d["fingerprint_identical_across_runs"] is True, w
    key = "unedited_tok_s" if w == "decode-b1" else "unedited_s"
    assert len(d[key + "_runs"]) == 2, d
    cost = d[key] / x["atlas"] if w == "decode-b1" else x["atlas"] / d[key]
    assert abs(d["edit_cost"] - cost) < 1e-12, (w, d)
# The scaled residual changes every later stage of the traced rows.
assert e["prefill-trace-128"]["detail"]["stage_hashes_sha256"] != plain["prefill-trace-128"]["detail"]["stage_hashes_sha256"]
assert e["decode-b1"]["detail"]["decode_ahead"] == 0  # edits: one forward call per step, as generate
h = hashlib.sha256()
for l in open(sys.argv[4]):
    ids = json.loads(l)["ids"]
    h.update(struct.pack("<%di" % len(ids), *ids))
assert e["seed-grid-128x512"]["detail"]["tokens_sha256"] == h.hexdigest()
# decode-b1 keeps the steps' tokens (the prompt's own greedy token comes before them).
ids = json.loads(open(sys.argv[5]).read())["ids"][1:]
assert e["decode-b1"]["detail"]["tokens_sha256"] == hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()
PY
expect_error "intervene beside load" "edits apply to" "$bin" bench --model "$model" --backend cpu --workload load \
  --intervene 'embed=zero' --json "$work/x.json"
no_file "intervene beside load" "$work/x.json"
expect_error "intervene on logits in decode" "cannot edit logits" "$bin" bench --model "$model" --backend cpu \
  --workload decode-b1 --intervene 'logits=zero' --json "$work/x.json"
no_file "intervene on logits in decode" "$work/x.json"
# The records name the ATLAS_* switches they were measured under (every one set, but
# ATLAS_GIT_COMMIT, which is the commit field's), sorted by name, and CUDA_DEVICE_MAX_CONNECTIONS:
# the caller's value, else (a CUDA build sets it before the driver starts) 32 or, without CUDA, none.
ATLAS_WIDE_NORM=1 ATLAS_PDL=0 CUDA_DEVICE_MAX_CONNECTIONS=8 "$bin" bench --model "$model" --backend cpu "${small[@]}" --workload load \
  --json "$work/env.json" >/dev/null 2>"$work/err" && ok "bench under switches ran" || bad "bench under switches: $(cat "$work/err")"
check_env='
import json, os, sys
want = {k: v for k, v in sorted(os.environ.items()) if k.startswith("ATLAS_") and k != "ATLAS_GIT_COMMIT"}
conn = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
for x in json.load(open(sys.argv[1])):
    env = dict(x["environment"])
    got = env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    assert env == want, (x["environment"], want)
    assert got == conn or (conn is None and got in (None, "32")), (got, conn)
    assert list(x["environment"]) == sorted(x["environment"]), x["environment"]
print(want.get("ATLAS_PDL"), want.get("ATLAS_WIDE_NORM"), got)
'
[[ "$(ATLAS_WIDE_NORM=1 ATLAS_PDL=0 CUDA_DEVICE_MAX_CONNECTIONS=8 $py -c "$check_env" "$work/env.json")" == "0 1 8" ]] \
  && $py -c "$check_env" "$work/b.json" >/dev/null \
  && ok "records name the ATLAS_* switches" || bad "records' environment"
# decode-b1's loop with 0 (one forward call per step) and 3 steps pushed ahead: the same tokens as
# the default (1), and the record says which it ran.
for a in 0 3; do
  "$bin" bench --model "$model" --backend cpu "${small[@]}" --workload decode-b1 --decode-ahead $a \
    --json "$work/ahead$a.json" >/dev/null 2>"$work/err" || bad "bench --decode-ahead $a: $(cat "$work/err")"
done
$py - "$work/ahead0.json" "$work/ahead3.json" "$work/b.json" <<'PY' && ok "decode-b1: the same tokens 0, 1 and 3 steps ahead" || bad "decode-ahead records"
import json, sys
recs = [{x["workload"]: x for x in json.load(open(f))}["decode-b1"]["detail"] for f in sys.argv[1:]]
assert [d["decode_ahead"] for d in recs] == [0, 3, 1], [d["decode_ahead"] for d in recs]
assert len({d["tokens_sha256"] for d in recs}) == 1, [d["tokens_sha256"] for d in recs]
PY
expect_error "decode-ahead 64" "decode-ahead" "$bin" bench --model "$model" --backend cpu --decode-ahead 64 --json "$work/x.json"
no_file "decode-ahead 64" "$work/x.json"
expect_error "repeat 0" "repeat" "$bin" bench --model "$model" --backend cpu --repeat 0 --json "$work/x.json"
no_file "repeat 0" "$work/x.json"

expect_error "unknown workload" "unknown workload" "$bin" bench --model "$model" --backend cpu --workload nope --json "$work/x.json"
no_file "unknown workload" "$work/x.json"
expect_error "fast on cpu" "fast exists on the cuda backend only" "$bin" bench --model "$model" --backend cpu --mode fast --json "$work/x.json"
echo '{"records": [{"workload": "load"}]}' >"$work/badref.json"
expect_error "bad reference" "badref.json.*value" "$bin" bench --model "$model" --backend cpu --workload load --reference "$work/badref.json" --json "$work/x.json"
no_file "bad reference" "$work/x.json"
echo '{"date": 5, "records": []}' >"$work/baddate.json"
expect_error "reference date not a string" "baddate.json.*date" "$bin" bench --model "$model" --backend cpu --workload load --reference "$work/baddate.json" --json "$work/x.json"
no_file "reference date not a string" "$work/x.json"
expect_error "missing model" "nowhere" "$bin" bench --model "$work/nowhere" --backend cpu --json "$work/x.json"
expect_error "prompt-max below prompt-min" "prompt-max.*>= --prompt-min" "$bin" bench --model "$model" --backend cpu \
  --prompt-min 9 --prompt-max 8 --json "$work/x.json"
no_file "prompt-max below prompt-min" "$work/x.json"
expect_error "prompt-min 0" "prompt-min" "$bin" bench --model "$model" --backend cpu --prompt-min 0 --json "$work/x.json"
no_file "prompt-min 0" "$work/x.json"

# --prompt-min / --prompt-max bound the grid's (and so the traced prefill's) prompt lengths.
"$bin" bench --model "$model" --backend cpu --grid-prompts 6 --prompt-min 7 --prompt-max 9 \
  --save-prompts "$work/p79.json" >/dev/null 2>&1 || bad "save prompts 7-9"
$py - "$work/p79.json" <<'PY' && ok "prompt lengths within --prompt-min/--prompt-max" || bad "prompt lengths"
import json, sys
p = json.load(open(sys.argv[1]))["prompts"]
assert len(p) == 6 and all(7 <= len(r) <= 9 for r in p), [len(r) for r in p]
PY
finish

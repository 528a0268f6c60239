#!/usr/bin/env bash
# atlas compare on real artifacts of the tiny checkpoint: fresh-process reruns of a trace and
# of a generation are byte-identical outside "runtime" and compare as identical; planted
# changes (one token, one hash, a missing row or cell) are found; a subset rerun states its
# coverage; bad input is a clear error (exit 1), a difference exit 3.
source "$(dirname "$0")/../cli/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
py=/usr/bin/python3
# cmp_rc NAME WANT A B [FLAGS...]: compare's exit status must be WANT; its output is in $work/out.
cmp_rc() {
  local name="$1" want="$2"; shift 2
  "$bin" compare "$@" >"$work/out" 2>"$work/err"; local rc=$?
  if [[ $rc -eq $want ]]; then ok "$name (exit $rc)"; else bad "$name: exit $rc, want $want: $(cat "$work/out" "$work/err")"; fi
}
has() {  # has NAME PATTERN: the last compare output matches PATTERN
  grep -qE -- "$2" "$work/out" && ok "$1" || bad "$1: /$2/ not in: $(cat "$work/out")"
}
# same_bytes_outside_runtime A B: the files are byte-identical up to their "runtime" section,
# which is the last top-level key (so this is a byte check, not a re-serialised one).
same_bytes_outside_runtime() {
  $py - "$1" "$2" <<'PY'
import json, sys
texts = [open(p, "rb").read() for p in sys.argv[1:]]
for t in texts:
    assert list(json.loads(t))[-1] == "runtime", "runtime is not the last key"
    assert t.count(b'\n  "runtime": ') == 1
heads = [t[: t.index(b'\n  "runtime": ')] for t in texts]
assert heads[0] == heads[1], "bytes differ outside runtime"
PY
}

# ---- traces: two fresh processes (different thread counts) --------------------------------
ids="1000,5,17,42,300,7,7,9,11,600,2,3"
"$bin" trace --model "$model" --ids "$ids" --json "$work/t1.json" --threads 1 >/dev/null || bad "trace 1"
"$bin" trace --model "$model" --ids "$ids" --json "$work/t2.json" --threads 2 >/dev/null || bad "trace 2"
same_bytes_outside_runtime "$work/t1.json" "$work/t2.json" && ok "traces byte-identical outside runtime" \
  || bad "traces differ outside runtime"
cmp_rc "trace rerun compares identical" 0 "$work/t1.json" "$work/t2.json"
has "trace summary counts hidden hashes" "hidden hashes +7 / 7$"   # 6 hidden stages + logits
has "trace summary counts route hashes" "route hashes +9 / 9$"     # 3 gates x ids, weights, logits
has "trace verdict" "^IDENTICAL$"

# A changed stage hash.
$py - "$work/t2.json" "$work/t3.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["stages"][2]["sha256"] = "0" * 64
open(sys.argv[2], "w").write(json.dumps(d, indent=2) + "\n")
PY
cmp_rc "changed stage hash found" 3 "$work/t1.json" "$work/t3.json"
has "changed hash: cell and family" '^  cell "hidden.2" sha256 \[hidden hashes\]'
has "changed hash: summary" "hidden hashes +6 / 7$"
# A trace of fewer layers: the missing cells are named.
"$bin" trace --model "$model" --ids "$ids" --layers 0-1 --json "$work/t4.json" >/dev/null
cmp_rc "partial trace differs" 3 "$work/t4.json" "$work/t1.json"
has "partial trace coverage" "4 of 10 cells shared; 6 only in B"
has "partial trace lists missing cells" 'only in B: .*"router.2"'

# ---- generations: seeded sampling, two fresh processes, different batch sizes ------------
cat > "$work/p.jsonl" <<'J'
{"id": "a", "ids": [1000, 5, 17, 42]}
{"id": "b", "ids": [1000, 300, 7]}
{"id": "c", "ids": [1000, 9, 11, 600, 2, 3]}
{"id": "d", "ids": [1000, 8]}
J
gen() { "$bin" generate --model "$model" --max-new-tokens 6 --temperature 0.9 --seed 7 "$@" 2>/dev/null; }
gen --prompts "$work/p.jsonl" --out "$work/g1.jsonl" --batch 4 --threads 1 || bad "generate 1"
gen --prompts "$work/p.jsonl" --out "$work/g2.jsonl" --batch 1 --threads 2 || bad "generate 2"
[[ -s "$work/g1.jsonl" ]] && cmp -s "$work/g1.jsonl" "$work/g2.jsonl" && ok "generation rows byte-identical" || bad "generation rows differ"
same_bytes_outside_runtime "$work/g1.jsonl.meta.json" "$work/g2.jsonl.meta.json" \
  && ok "generation sidecars identical outside runtime" || bad "sidecars differ outside runtime"
mkdir -p "$work/reports"
cmp_rc "generation rerun compares identical" 0 "$work/g1.jsonl" "$work/g2.jsonl" --json "$work/reports/cmp.json"
has "generation coverage" "^4 of 4 rows shared$"
for f in "prompt hashes" "token ids" "texts" "RNG hashes"; do has "generation family $f" "$f +4 / 4$"; done
$py - "$work/reports/cmp.json" "$work/g1.jsonl" "$work/g2.jsonl.meta.json" <<'PY' && ok "compare --json names inputs by sha256" || bad "compare --json"
import hashlib, json, os, sys
j = json.load(open(sys.argv[1]))
assert j["kind"] == "atlas.compare" and j["identical"] is True and j["counted_differences"] == 0
# Input paths are relative to the report's directory.
assert all(f["path"].startswith("../") for f in j["inputs"]), j["inputs"]
base = os.path.dirname(sys.argv[1])
files = {os.path.normpath(os.path.join(base, f["path"])): f["sha256"] for f in j["inputs"]}
assert len(files) == 4
for p in sys.argv[2:]:
    assert files[p] == hashlib.sha256(open(p, "rb").read()).hexdigest(), p
PY

# One planted token change in row b.
$py - "$work/g2.jsonl" "$work/g3.jsonl" <<'PY'
import json, shutil, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows[1]["ids"][1] = (rows[1]["ids"][1] + 1) % 1024
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in rows))
shutil.copy(sys.argv[1] + ".meta.json", sys.argv[2] + ".meta.json")
PY
cmp_rc "planted token change found" 3 "$work/g1.jsonl" "$work/g3.jsonl"
has "token change: row, field, element" '^  row "b" ids \[token ids\]: element \[1\] of [0-9]+: .* \(1 element differs\)'
has "token change: summary" "token ids +3 / 4$"
cmp_rc "--ignore ids hides it" 0 "$work/g1.jsonl" "$work/g3.jsonl" --ignore ids

# A missing row (file and sidecar consistent).
$py - "$work/g2.jsonl" "$work/g5.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).readlines()
del lines[2]
open(sys.argv[2], "w").write("".join(lines))
meta = json.load(open(sys.argv[1] + ".meta.json")); meta["rows"] = 3
open(sys.argv[2] + ".meta.json", "w").write(json.dumps(meta))
PY
cmp_rc "missing row found" 3 "$work/g5.jsonl" "$work/g1.jsonl"
has "missing row coverage" '^3 of 4 rows shared; 1 only in B$'
has "missing row named" '^only in B: "c"$'

# A real subset rerun: rows b and d alone, in a fresh process, reproduce the full run's rows.
grep -E '"(b|d)"' "$work/p.jsonl" > "$work/sub.jsonl"
gen --prompts "$work/sub.jsonl" --out "$work/gs.jsonl" || bad "subset generate"
cmp_rc "subset rerun without --subset" 3 "$work/gs.jsonl" "$work/g1.jsonl"
cmp_rc "subset rerun with --subset" 0 "$work/gs.jsonl" "$work/g1.jsonl" --subset
has "subset coverage" "^2 of 4 rows shared; 2 only in B \(allowed: --subset\)$"
has "subset: aggregates not compared" "not compared .*\"rows\""

# ---- bad input: exit 1, one clear line naming the file ----------------------------------
expect_error "different kinds" "only artifacts of one kind" "$bin" compare "$work/t1.json" "$work/g1.jsonl"
{ head -n 1 "$work/g1.jsonl"; sed -n 2p "$work/g1.jsonl" | head -c 40; } > "$work/cut.jsonl"; cp "$work/g1.jsonl.meta.json" "$work/cut.jsonl.meta.json"
expect_error "truncated JSONL" "cut.jsonl:2: truncated" "$bin" compare "$work/cut.jsonl" "$work/g1.jsonl"
{ head -n 1 "$work/g1.jsonl"; echo '{"id": "b", "ids": [1,'; } > "$work/mal.jsonl"; cp "$work/g1.jsonl.meta.json" "$work/mal.jsonl.meta.json"
expect_error "malformed JSON line" "mal.jsonl:2: malformed JSON" "$bin" compare "$work/g1.jsonl" "$work/mal.jsonl"
head -c 300 "$work/t1.json" > "$work/cut.json"
expect_error "truncated trace" "cut.json: malformed JSON" "$bin" compare "$work/cut.json" "$work/t1.json" --json "$work/x.json"
no_file "truncated trace" "$work/x.json"
expect_error "missing file" "none.json" "$bin" compare "$work/none.json" "$work/t1.json"
cp "$work/g1.jsonl" "$work/lone.jsonl"
expect_error "JSONL without sidecar" "lone.jsonl: no sidecar" "$bin" compare "$work/lone.jsonl" "$work/g1.jsonl"
finish

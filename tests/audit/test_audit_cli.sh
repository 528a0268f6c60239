#!/usr/bin/env bash
# atlas audit DIR end to end on the tiny checkpoint: freeze -> run -> (eval) -> analyze for a
# trace-mode run (routes, hidden vectors) and a generate-mode run (a small local GSM8K file),
# then the audit must hold, and must FAIL with a clear line for a flipped byte, a broken chain
# link, counts that do not add up (a journal line removed, a cell dropped, a ledger total
# edited) and a missing artifact. compare finds planted changes in EVAL.json and analysis.json.
# Bad input: exit 1 with one line; findings: exit 3.
source "$(dirname "$0")/../cli/lib.sh"
export OMP_NUM_THREADS=1
unset ATLAS_PROGRESS
py=/usr/bin/python3

"$bin" make-model --preset tiny --seed 0 "$work/tiny" >/dev/null || { bad "make-model"; finish; }

# audit_rc NAME WANT DIR [FLAGS...]: atlas audit's exit status must be WANT; output in $work/out.
audit_rc() {
  local name="$1" want="$2"; shift 2
  "$bin" audit "$@" >"$work/out" 2>"$work/err"; local rc=$?
  if [[ $rc -eq $want ]]; then ok "$name (exit $rc)"; else bad "$name: exit $rc, want $want: $(cat "$work/out" "$work/err")"; fi
}
has() {  # has NAME PATTERN: the last audit/compare output matches PATTERN (extended regex)
  grep -qE -- "$2" "$work/out" && ok "$1" || bad "$1: /$2/ not in: $(cat "$work/out")"
}
fails_only() {  # fails_only NAME PATTERN: every FAIL line matches PATTERN (and there is one)
  local n
  n=$(grep -c '^FAIL' "$work/out")
  if [[ $n -ge 1 ]] && ! grep '^FAIL' "$work/out" | grep -qvE -- "$2"; then ok "$1 ($n FAIL line(s))"
  else bad "$1: FAIL lines: $(grep '^FAIL' "$work/out")"; fi
}
edit_json() {  # edit_json FILE PYTHON: d = the parsed file; PYTHON edits it; written back (indent 1)
  $py - "$1" "$2" <<'PY'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
exec(sys.argv[2])
open(p, "w").write(json.dumps(d, indent=1) + "\n")
PY
}

# ---- a trace-mode run: routes, hidden vectors; manifest outside the run directory ----------
tiny_trace_protocol "audit-trace" "$work/tiny" "$work/t.toml"
T="$work/trun"
"$bin" freeze "$work/t.toml" --out "$work/mt.json" >/dev/null || { bad "freeze"; finish; }
"$bin" run "$work/mt.json" --out "$T" >/dev/null || { bad "run"; finish; }
"$bin" analyze "$T" --manifest "$work/mt.json" --out "$T/analysis" --replicates 20 --task-replicates 20 >/dev/null \
  || { bad "analyze"; finish; }

audit_rc "clean trace run holds" 0 "$T" --json "$work/audit.json"
has "manifest found through the run's input record" '^  manifest +.*mt\.json .*\[run\.json inputs'
has "analysis found in DIR/analysis" '^  analysis +.*analysis\.json .*\[DIR/analysis/analysis\.json\]'
has "cell grid: 4 sources x 3 conditions" '^PASS  cells = sources x conditions: 4 sources x 3 conditions = 12 = manifest cells 12'
has "edits re-derived" '^PASS  edits as declared: 12 cells, 8 edited ids'
has "route decisions" '^PASS  route decisions = tokens x gates x k: [0-9]+ tokens \(12 cells over 3 conditions\) x [0-9]+ gates x k=[0-9]+ = [0-9]+ = recorded'
has "journals" '^PASS  journal lines accounted for: 4 journals .* 16 lines = 4 headers \+ 12 cell lines'
has "hidden vectors" '^PASS  hidden vectors = stage hashes: [0-9]+ tensors in 4 files'
has "chain analysis -> run" '^PASS  chain analysis -> run: '
has "chain run -> manifest" '^PASS  chain run -> manifest: '
has "analysis counts" '^PASS  analysis counts = run counts: 12 cells, 4 sources, 3 conditions, route decisions'
has "verdict" '^AUDIT HOLDS'

# The route-decision count, independently: sum over cells of tokens x gates x k from run.json,
# and the same number in the --json report.
$py - "$T/run.json" "$work/audit.json" "$work/tiny/config.json" <<'PY' && ok "route decisions recomputed here; --json report" || bad "route decisions / --json report"
import json, sys
run, rep, cfg = (json.load(open(p)) for p in sys.argv[1:])
moe = [l for l in range(cfg["num_hidden_layers"]) if l >= cfg["first_k_dense_replace"] and l % cfg["moe_layer_freq"] == 0]
want = sum(c["n_tokens"] for c in run["cells"]) * len(moe) * cfg["num_experts_per_tok"]
got = sum(len(r["topk_ids"]) * len(r["topk_ids"][0]) for c in run["cells"] for r in c["result"]["routes"])
assert want == got, (want, got)
chk = {c["check"]: c for c in rep["checks"]}
rd = chk["route decisions = tokens x gates x k"]
assert rd["status"] == "pass" and rd["numbers"]["recorded"] == want, rd
assert rep["kind"] == "atlas.audit" and rep["holds"] is True and rep["failed"] == 0
roles = {a["role"]: a for a in rep["artifacts"]}
import hashlib
assert roles["run"]["sha256"] == hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()
PY

# Provenance in the run, and content_sha256 independent of it.
$py - "$T/run.json" "$T/analysis/analysis.json" <<'PY' && ok "provenance in run.json and analysis.json" || bad "provenance"
import json, sys
run, an = (json.load(open(p)) for p in sys.argv[1:])
p = run["provenance"]
for k in ("tool", "version", "git_commit", "build_type", "build_flags", "device", "compute", "model", "protocol_sha256", "manifest_sha256", "seeds"):
    assert k in p, k
assert p["device"]["backend"] == "cpu" and p["device"]["device"]
assert p["manifest_sha256"] == run["manifest_sha256"] and p["protocol_sha256"] == run["protocol"]["sha256"]
assert list(run)[-1] == "runtime" and run["inputs"][0]["role"] == "manifest"
assert an["kind"] == "atlas.analysis" and "git_commit" in an["provenance"] and list(an)[-1] == "runtime"
assert [r["role"] for r in an["inputs"]] == ["run", "manifest"], an["inputs"]
PY

# Each planted fault on a fresh copy: copy_trace NAME -> $work/NAME (the manifest stays shared).
copy_trace() { rm -rf "$work/$1"; cp -r "$T" "$work/$1"; }

# A flipped byte inside a recorded hash of run.json: the run's content hash and every link to
# the run fail; the re-derived gate hashes point at the cell.
copy_trace flip
$py - "$work/flip/run.json" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
i = b.index(b'"full_ids_sha256": "') + len(b'"full_ids_sha256": "')
b[i] = ord("0") if b[i] != ord("0") else ord("1")
open(p, "wb").write(bytes(b))
PY
audit_rc "flipped byte fails" 3 "$work/flip"
has "flipped byte: content hash line" '^FAIL  artifact run: .*run\.json: content_sha256 [0-9a-f]{12}… recorded, the content hashes to'
has "flipped byte: chain line" '^FAIL  chain analysis -> run: .*inputs\[0\]\.sha256 [0-9a-f]{12}… but .*run\.json has'
has "flipped byte: gate hash line" '^FAIL  route decisions = tokens x gates x k: .*full_ids_sha256 does not match the recorded routes'
has "verdict" '^AUDIT FAILS'

# A broken chain link only: the run rewritten with a different runtime section (same content)
# no longer is the file the analysis read.
copy_trace link
edit_json "$work/link/run.json" 'd["runtime"]["seconds"] = 12345.0'
audit_rc "broken chain link fails" 3 "$work/link"
fails_only "broken link: only the analysis -> run link fails" '^FAIL  chain analysis -> run: '
# And a link naming another file's hash: the run's manifest record.
copy_trace link2
edit_json "$work/link2/run.json" 'd["inputs"][0]["sha256"] = "ab" * 32'
audit_rc "run naming another manifest hash fails" 3 "$work/link2"
has "run -> manifest link" '^FAIL  chain run -> manifest: .*inputs\[0\]\.sha256 abababababab… but .*mt\.json has'

# Counts that do not add up.
copy_trace jline
j="$(ls "$work/jline/journal/"*.jsonl | head -1)"
sed -i '2d' "$j"
audit_rc "journal line removed fails" 3 "$work/jline"
fails_only "journal line removed: the journal check fails" '^FAIL  journal lines accounted for: .*header declares [0-9]+ cells, the journal holds'
copy_trace jfile
rm "$(ls "$work/jfile/journal/"*.jsonl | head -1)"
audit_rc "journal removed fails" 3 "$work/jfile"
has "journal removed: first missing cell named" '^FAIL  journal lines accounted for: 9 of 12 run cells have a journal line; first missing '
# A missing artifact: the manifest named by the run; an analysis named by --analysis.
copy_trace nomanifest
audit_rc "missing manifest fails" 3 "$work/nomanifest" --manifest "$work/absent.json"
has "missing manifest line" '^FAIL  artifact manifest: manifest missing \(.*absent\.json\)'
# The run's manifest record with an empty path: named as such (not resolved to the run's directory).
copy_trace emptymanifest
edit_json "$work/emptymanifest/run.json" 'd["inputs"][0]["path"] = ""'
audit_rc "empty manifest path fails" 3 "$work/emptymanifest"
has "empty manifest path line" "^FAIL  artifact manifest: .*manifest input record has an empty path"
audit_rc "missing --analysis fails" 3 "$T" --analysis "$work/absent-analysis"
has "missing analysis line" '^FAIL  artifact analysis: analysis missing'
copy_trace truncated
head -c 2000 "$T/run.json" > "$work/truncated/run.json"
audit_rc "truncated run.json fails" 3 "$work/truncated"
has "truncated run line" '^FAIL  artifact run: .*run\.json: not valid JSON \(truncated or damaged\)'
# An artifact of another kind where the analysis should be.
audit_rc "wrong kind fails" 3 "$T" --analysis "$T/run.json"
has "wrong kind line" '^FAIL  artifact analysis: .*run\.json: kind: "atlas\.probe\.run", expected "atlas\.analysis"'

# Bad input: not a directory (exit 1, one line, no --json output).
expect_error "audit of a file" 'run\.json: not a directory' "$bin" audit "$T/run.json" --json "$work/bad.json"
no_file "audit of a file" "$work/bad.json"
expect_error "audit without DIR" 'DIR is required' "$bin" audit

# ---- a generate-mode run with an evaluation (GSM8K from a local file) ------------------------
mkdir -p "$work/data"
cat > "$work/data/gsm8k.jsonl" <<'J'
{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"}
{"question": "A box holds 12 pens. Half are red. How many are red?", "answer": "12 / 2 = 6\n#### 6"}
{"question": "Sara reads 5 pages a day for 4 days. How many pages?", "answer": "5 * 4 = 20\n#### 20"}
J
cat > "$work/g.toml" <<TOML
[protocol]
name = "audit-generate"

[model]
dir = "$work/tiny"

[data]
root = "$work/data"

[[corpus]]
domain = "math"
format = "gsm8k"
path = "gsm8k.jsonl"

[selection]
salt = "audit-generate"
per_domain = 2

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 3

[[condition]]
name = "s0_eos"
history = "filler"
group = "s0"

[[condition]]
name = "s0_period"
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "." }]

[execution]
mode = "generate"
max_new_tokens = 4
sampling = "greedy"

[batching]
sources_per_batch = 2
TOML
G="$work/grun"
mkdir -p "$G"
"$bin" freeze "$work/g.toml" --out "$G/manifest.json" >/dev/null || { bad "freeze generate"; finish; }
"$bin" run "$G/manifest.json" --out "$G" >/dev/null || { bad "run generate"; finish; }
"$bin" eval "$G/run.json" --manifest "$G/manifest.json" --out "$G/EVAL.json" >/dev/null || { bad "eval"; finish; }
"$bin" analyze "$G" --manifest "$G/manifest.json" --out "$G/analysis" --replicates 20 --task-replicates 20 >/dev/null \
  || { bad "analyze generate"; finish; }
audit_rc "clean generate run with evaluation holds" 0 "$G"
has "eval found" '^  evaluation +.*EVAL\.json .*\[DIR/EVAL\.json\]'
has "chain evaluation -> run" '^PASS  chain evaluation -> run: '
has "chain evaluation -> manifest" '^PASS  chain evaluation -> manifest: '
has "stop states" '^PASS  stop states re-derived: 4 cells: eos [0-9]+, length [0-9]+'
has "ledgers" '^PASS  stop counts = ledger totals: run stops eos [0-9]+ \+ length [0-9]+ = ledgers\.stopping'
has "analysis stops" '^PASS  analysis counts = run counts: 4 cells, 2 sources, 2 conditions, stops eos'
has "routes skipped in generate mode" '^SKIP  route decisions = tokens x gates x k: a generate-mode run records no routes'
has "verdict" '^AUDIT HOLDS'
$py - "$G/run.json" "$G/EVAL.json" <<'PY' && ok "stop counts recomputed here equal the ledger" || bad "stop counts vs ledger"
import json, sys
run, ev = (json.load(open(p)) for p in sys.argv[1:])
stops = [c["result"]["stop"] for c in run["cells"]]
assert ev["ledgers"]["stopping"] == {"eos": stops.count("eos"), "length": stops.count("length")}, ev["ledgers"]["stopping"]
assert [r["role"] for r in ev["inputs"]][:2] == ["run", "manifest"] and "git_commit" in ev["provenance"]
PY

copy_gen() { rm -rf "$work/$1"; cp -r "$G" "$work/$1"; }
# A ledger total edited (content_sha256 recomputed, so only the recount can catch it).
copy_gen ledger
$py - "$work/ledger/EVAL.json" <<'PY'
import hashlib, json, sys
p = sys.argv[1]
d = json.load(open(p))
st = d["ledgers"]["stopping"]
k = "eos" if st["eos"] > 0 else "length"
st[k] -= 1
st["length" if k == "eos" else "eos"] += 1
c = {k: v for k, v in d.items() if k not in ("runtime", "provenance", "inputs", "content_sha256")}
d["content_sha256"] = hashlib.sha256(json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
open(p, "w").write(json.dumps(d, indent=1) + "\n")
PY
audit_rc "edited ledger total fails" 3 "$work/ledger"
fails_only "edited ledger: the ledger check fails" '^FAIL  stop counts = ledger totals: .*ledgers\.stopping\.(eos|length) is [0-9]+, the cells count [0-9]+'
# A cell dropped from run.json and content_sha256 recomputed, as a careless rewrite would: the
# hash holds, the counts do not. (A generate-mode run: no floats, so Python's compact dump is
# nlohmann's byte for byte.)
copy_gen drop
$py - "$work/drop/run.json" <<'PY'
import hashlib, json, sys
p = sys.argv[1]
d = json.load(open(p))
del d["cells"][1]
c = {k: v for k, v in d.items() if k not in ("runtime", "provenance", "inputs", "content_sha256")}
d["content_sha256"] = hashlib.sha256(json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
open(p, "w").write(json.dumps(d, indent=1, ensure_ascii=False) + "\n")
PY
audit_rc "dropped cell fails" 3 "$work/drop"
has "dropped cell: its content hash still holds" '^PASS  artifact run: '
has "dropped cell: run cells" '^FAIL  run cells = manifest cells: .*cells\[1\] is .*\(3 cells, expected 4\)'
has "dropped cell: ledgers" '^FAIL  stop counts = ledger totals: .*EVAL\.json: 4 evaluated cells, the run has 3'
has "dropped cell: analysis counts" '^FAIL  analysis counts = run counts: .*counts\.cells is 4, the run has 3'
has "dropped cell: journal line left over" '^FAIL  journal lines accounted for: .*is not a cell of this run'
# The evaluation's run link: EVAL.json names the run by hash; a rewritten run.json breaks it.
copy_gen evlink
edit_json "$work/evlink/run.json" 'd["runtime"]["seconds"] = 1.5'
audit_rc "rewritten run breaks the evaluation link" 3 "$work/evlink"
has "eval link names the rewrite" '^FAIL  chain evaluation -> run: .*content_sha256 is still the one the evaluation read'
# A missing evaluation named by --eval.
audit_rc "missing --eval fails" 3 "$G" --eval "$work/none/EVAL.json"
has "missing eval line" '^FAIL  artifact evaluation: evaluation missing'

# ---- compare: evaluation and analysis kinds ---------------------------------------------------
"$bin" eval "$G/run.json" --manifest "$G/manifest.json" --out "$work/EVAL2.json" >/dev/null || bad "eval 2"
"$bin" compare "$G/EVAL.json" "$work/EVAL2.json" >"$work/out" 2>&1 && ok "evaluation rerun compares identical" \
  || bad "evaluation rerun: $(cat "$work/out")"
has "eval coverage" '^4 of 4 cells shared$'
has "eval verdict family" 'verdicts +[0-9]+ / [0-9]+$'
cp "$work/EVAL2.json" "$work/EVAL3.json"
edit_json "$work/EVAL3.json" 'c = d["cells"][2]; c["correctness"] = "correct" if c["correctness"] != "correct" else "incorrect"'
"$bin" compare "$G/EVAL.json" "$work/EVAL3.json" >"$work/out" 2>&1; rc=$?
[[ $rc -eq 3 ]] && ok "planted verdict change: exit 3" || bad "planted verdict change: exit $rc"
cid=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["cells"][2]["cell_id"])' "$G/EVAL.json")
has "planted verdict change: cell and family" "^  cell \"$cid\" correctness \[verdicts\]"
"$bin" analyze "$T" --manifest "$work/mt.json" --out "$work/a2" --replicates 20 --task-replicates 20 >/dev/null || bad "analyze 2"
"$bin" compare "$T/analysis/analysis.json" "$work/a2/analysis.json" >"$work/out" 2>&1 && ok "analysis rerun compares identical" \
  || bad "analysis rerun: $(cat "$work/out")"
has "analysis statistics family" 'derived statistics +([0-9]+) / \1$'
has "analysis intervals family" 'intervals +([0-9]+) / \1$'
edit_json "$work/a2/analysis.json" 'r = [x for x in d["routing"]["stats"] if x["metric"] == "tv" and x["value"]][0]; r["value"] = r["value"] * 2'
"$bin" compare "$T/analysis/analysis.json" "$work/a2/analysis.json" >"$work/out" 2>&1; rc=$?
[[ $rc -eq 3 ]] && ok "planted statistic change: exit 3" || bad "planted statistic change: exit $rc"
has "planted statistic change: record id and family" '^  record "routing\.stats tv aggregation=token domain=[a-z]+ edge=.* kind=count layer=[0-9]+ scope=[a-z]+" value \[derived statistics\]'
has "planted statistic change: one difference" '^DIFFERENT \(1 field difference\)'
# Different bootstrap replicates: points equal, intervals differ.
"$bin" analyze "$T" --manifest "$work/mt.json" --out "$work/a3" --replicates 30 --task-replicates 20 >/dev/null || bad "analyze 3"
"$bin" compare "$T/analysis/analysis.json" "$work/a3/analysis.json" >"$work/out" 2>&1
has "other replicates: intervals differ" 'intervals +[0-9]+ / [0-9]+$'
has "other replicates: settings differ" '\[settings\]'
# Bad input for compare: different kinds; a truncated analysis.
"$bin" compare "$G/EVAL.json" "$T/analysis/analysis.json" >"$work/out" 2>&1; rc=$?
[[ $rc -eq 1 ]] && grep -q "analysis.json" "$work/out" && ok "different kinds: exit 1 naming the file ($(head -1 "$work/out"))" \
  || bad "different kinds: exit $rc: $(cat "$work/out")"
head -c 3000 "$T/analysis/analysis.json" > "$work/cut.json"
expect_error "truncated analysis" 'cut\.json' "$bin" compare "$work/cut.json" "$T/analysis/analysis.json"
finish

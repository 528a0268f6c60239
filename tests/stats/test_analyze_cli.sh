# atlas analyze from the command line: a small run writes every artifact deterministically;
# bad inputs fail with one error naming the file and field and leave no output behind.
source "$(dirname "$0")/../cli/lib.sh"

cat > "$work/in.json" <<'JSON'
{"format": "atlas-analysis-input-v1", "manifest_sha256": "m1", "experts": 4, "top_k": 2, "layers": [1, 2],
 "hidden_stages": ["embed", "final"], "conditions": ["off", "on"],
 "sources": [{"id": "a", "domain": "d0"}, {"id": "b", "domain": "d0"}, {"id": "c", "domain": "d1"}],
 "edges": [{"name": "on-off", "condition": "on", "reference": "off"}],
 "cells": [
  {"source": "a", "condition": "off", "routes": {"topk_ids": [[[0,1],[1,2]],[[2,3],[0,3]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[1,2],[3,4]],[[0.5,1],[2,0]]], "generated_ids": [1,2,3], "stop": "eos", "correct": true},
  {"source": "a", "condition": "on", "routes": {"topk_ids": [[[0,1],[2,1]],[[2,3],[1,3]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[1,2],[3,4]],[[0.4,1],[2,0.1]]], "generated_ids": [1,2,4,5], "stop": "length", "correct": false},
  {"source": "b", "condition": "off", "routes": {"topk_ids": [[[3,1],[1,2]],[[2,0],[0,3]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[1,1],[2,2]],[[1,1],[2,1]]], "generated_ids": [7], "stop": "eos"},
  {"source": "b", "condition": "on", "routes": {"topk_ids": [[[3,1],[1,0]],[[2,0],[0,1]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[1,1],[2,2]],[[1,1.5],[2,1]]], "generated_ids": [7], "stop": "eos"},
  {"source": "c", "condition": "off", "routes": {"topk_ids": [[[0,2],[1,2]],[[2,3],[0,3]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[0,1],[1,0]],[[1,0],[0,1]]]},
  {"source": "c", "condition": "on", "routes": {"topk_ids": [[[0,2],[3,2]],[[3,2],[0,3]]], "topk_weights": [[[0.5,0.5],[0.7,0.3]],[[0.6,0.4],[0.5,0.5]]]},
   "hidden": [[[0,1],[1,0]],[[1,0.2],[0,1]]]}
 ]}
JSON

"$bin" analyze "$work/in.json" --out "$work/a" --replicates 200 --task-replicates 200 >/dev/null || bad "analyze failed"
"$bin" analyze "$work/in.json" --out "$work/b" --replicates 200 --task-replicates 200 --threads 1 >/dev/null || bad "analyze --threads 1 failed"
for f in analysis.json report.md depth_cosine_row_mean.svg heat_tv_on-off.svg load_L2_off.svg; do
  [[ -s "$work/a/$f" ]] && ok "wrote $f" || bad "missing $f"
done
# Deterministic apart from the runtime section, whatever the thread count.
strip() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("runtime"); print(json.dumps(d))' "$1"; }
[[ "$(strip "$work/a/analysis.json")" == "$(strip "$work/b/analysis.json")" ]] && ok "analysis.json identical" || bad "analysis.json differs"
cmp -s "$work/a/report.md" "$work/b/report.md" && ok "report.md identical" || bad "report.md differs"
grep -q "^## Hidden states" "$work/a/report.md" && ok "report has hidden states" || bad "report lacks hidden states"
"$bin" analyze --help | grep -q -- "--task-replicates" && ok "--help" || bad "--help"

# Bad input.
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
d = json.load(open(f"{w}/in.json"))
def dump(name, doc): json.dump(doc, open(f"{w}/{name}", "w"))
x = json.loads(json.dumps(d)); del x["cells"][0]["source"]; dump("nosource.json", x)
x = json.loads(json.dumps(d)); x["domains"] = ["d0", "d1", "d2"]; dump("emptydomain.json", x)
x = json.loads(json.dumps(d)); x["cells"][1]["hidden"][1][0] = [1]; dump("shape.json", x)
x = json.loads(json.dumps(d)); x["cells"] = x["cells"][4:]; x["manifest_sha256"] = "m2"; dump("other.json", x)
y = json.loads(json.dumps(d)); y["cells"] = y["cells"][:4]; dump("first.json", y)
PY
printf '{"format": "atlas-analysis-input-v1", ' > "$work/trunc.json"
expect_error "missing field" 'nosource.json: cells\[0\].source: missing field' "$bin" analyze "$work/nosource.json" --out "$work/o1"
no_file "missing field" "$work/o1"
expect_error "empty domain" 'emptydomain.json: domains: domain "d2" has no sources' "$bin" analyze "$work/emptydomain.json" --out "$work/o2"
expect_error "row shape" 'shape.json: cells\[1\].hidden\[1\]\[0\]: expected 2 entries' "$bin" analyze "$work/shape.json" --out "$work/o3"
expect_error "truncated" 'trunc.json: malformed JSON' "$bin" analyze "$work/trunc.json" --out "$work/o4"
expect_error "mixed manifests" 'other.json: manifest_sha256: inputs come from different manifests.*--allow-mixed' \
  "$bin" analyze "$work/first.json" "$work/other.json" --out "$work/o5"
no_file "mixed manifests" "$work/o5"
"$bin" analyze "$work/first.json" "$work/other.json" --allow-mixed --out "$work/o6" --replicates 20 --task-replicates 20 >/dev/null \
  && ok "--allow-mixed merges" || bad "--allow-mixed failed"
expect_error "bad level" '--level: expected a value in \(0, 1\)' "$bin" analyze "$work/in.json" --out "$work/o7" --level 1.5
# A directory that is not a probe run's (no run.json): named as such, not a bare read error.
mkdir -p "$work/notarun"
expect_error "not a run directory" 'notarun/run.json: missing: a directory given to analyze must be a probe run' \
  "$bin" analyze "$work/notarun" --out "$work/o8"
no_file "not a run directory" "$work/o8"
finish

# atlas analyze on a probe run artifact (the adapter, src/stats/run_adapter.*): tiny model,
# freeze + trace-mode run, then analysis.json checked against an independent Python
# recomputation of per-layer TV from run.json's routes, the causal negative control (an edit
# after the target cannot change the target's routes or hidden rows: TV, JSD exactly 0, every
# row bit-exact), byte-identical reruns outside "runtime", and bad input.
source "$(dirname "$0")/../cli/lib.sh"
export OMP_NUM_THREADS=1
unset ATLAS_PROGRESS

"$bin" make-model --preset tiny --seed 0 "$work/tiny" >/dev/null || { bad "make-model"; finish; }
tiny_trace_protocol "analyze-run-test" "$work/tiny" "$work/p.toml"
"$bin" freeze "$work/p.toml" --out "$work/m.json" >/dev/null || { bad "freeze"; finish; }
"$bin" run "$work/m.json" --out "$work/run" >/dev/null || { bad "run"; finish; }

opts=(--replicates 50 --task-replicates 50)
"$bin" analyze "$work/run" --manifest "$work/m.json" --out "$work/a" "${opts[@]}" >/dev/null || bad "analyze RUN_DIR failed"
"$bin" analyze "$work/run/run.json" --manifest "$work/m.json" --out "$work/b" "${opts[@]}" --threads 2 >/dev/null \
  || bad "analyze run.json failed"
"$bin" analyze "$work/run" --out "$work/c" "${opts[@]}" >/dev/null || bad "analyze without --manifest failed"

/usr/bin/python3 - "$work" <<'PY' && ok "analysis.json matches the run (edges, TV/JSD per layer, causal control)" || bad "analysis.json checks"
import json, sys
w = sys.argv[1]
run = json.load(open(f"{w}/run/run.json"))
a = json.load(open(f"{w}/a/analysis.json"))
conds = ["s0_eos", "s0_post", "s0_period"]
edges = {"s0_post vs s0_eos": ("s0_post", "s0_eos"), "s0_period vs s0_eos": ("s0_period", "s0_eos")}
cells = run["cells"]
layers = [str(r["layer"]) for r in cells[0]["result"]["routes"]]
assert len(layers) >= 2, layers
assert [str(x) for x in a["routing"]["layers"]] == layers, a["routing"]["layers"]
E = a["routing"]["experts"]
cfg = json.load(open(f"{w}/tiny/config.json"))
assert E == cfg["n_routed_experts"], (E, cfg)

def dist(cond, li, scope, domain):
    # Token-weighted count distribution over experts, pooled over the domain's sources.
    cnt = [0] * E
    for c in cells:
        if c["condition"] != cond or (domain != "all" and c["domain"] != domain):
            continue
        lo, hi = c["interior_token_range"] if scope == "target" else (0, c["n_tokens"])
        for t in range(lo, hi):
            for e in c["result"]["routes"][li]["topk_ids"][t]:
                cnt[e] += 1
    n = sum(cnt)
    return [x / n for x in cnt]

rows = a["routing"]["stats"]
def stat(metric, layer, edge, scope, domain="all"):
    hit = [r for r in rows if r["metric"] == metric and str(r["layer"]) == layer and r.get("edge") == edge
           and r["scope"] == scope and r["domain"] == domain and r["kind"] == "count" and r["aggregation"] == "token"]
    assert len(hit) == 1, (metric, layer, edge, scope, len(hit))
    return hit[0]["value"]

changed = 0
for name, (c, ref) in edges.items():
    for li, l in enumerate(layers):
        for scope in ("target", "full"):
            for domain in ("all", "english", "code"):
                p, q = dist(c, li, scope, domain), dist(ref, li, scope, domain)
                tv = 0.5 * sum(abs(x - y) for x, y in zip(p, q))
                got = stat("tv", l, name, scope, domain)
                assert abs(got - tv) <= 1e-12, (name, l, scope, domain, got, tv)
                assert stat("jsd_bits", l, name, scope, domain) is not None
                if name.startswith("s0_period") and tv > 0:
                    changed += 1
        # The causal negative control: the edit comes after the whole target.
        if name.startswith("s0_post"):
            assert stat("tv", l, name, "target") == 0.0 and stat("jsd_bits", l, name, "target") == 0.0, (name, l)
assert changed > 0, "the pre-target edit changed no route (the comparison would not catch anything)"

h = a["hidden"]
assert h["stages"] == [s["name"] for s in cells[0]["result"]["stages"]], h["stages"]
assert h["hidden_dim"] == cfg["hidden_size"]
ex = [r for r in h["stats"] if r["metric"] == "exact_row_rate" and r["edge"] == "s0_post vs s0_eos" and r["domain"] == "all"]
assert len(ex) == len(h["stages"]) and all(r["value"] == 1.0 for r in ex), ex
ex = [r for r in h["stats"] if r["metric"] == "exact_row_rate" and r["edge"] == "s0_period vs s0_eos" and r["domain"] == "all"]
assert any(r["value"] < 1.0 for r in ex), ex
# Without --manifest: same conditions (first appearance = manifest order), same numbers.
c = json.load(open(f"{w}/c/analysis.json"))
assert c["routing"]["stats"] == a["routing"]["stats"] and c["hidden"]["stats"] == h["stats"]
PY

strip() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("runtime"); print(json.dumps(d))' "$1"; }
sed_paths() { strip "$1" | sed "s#$work/run/run.json#RUN#g; s#$work/run#RUN#g"; }
[[ -s "$work/a/analysis.json" && "$(sed_paths "$work/a/analysis.json")" == "$(sed_paths "$work/b/analysis.json")" ]] \
  && ok "analysis.json identical on rerun (outside runtime)" || bad "analysis.json differs on rerun"
"$bin" analyze "$work/run" --manifest "$work/m.json" --out "$work/a2" "${opts[@]}" >/dev/null
[[ -s "$work/a2/analysis.json" ]] && cmp -s <(strip "$work/a/analysis.json") <(strip "$work/a2/analysis.json") && cmp -s "$work/a/report.md" "$work/a2/report.md" \
  && ok "byte-identical rerun" || bad "rerun differs"

# Bad input: a manifest that is not the run's; a missing hidden-vector file; a run without routes.
/usr/bin/python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["manifest_sha256"]="0"*64; json.dump(m, open(sys.argv[2],"w"))' \
  "$work/m.json" "$work/other.json"
expect_error "foreign manifest" 'other.json: manifest_sha256: is not the manifest of' \
  "$bin" analyze "$work/run" --manifest "$work/other.json" --out "$work/o1"
no_file "foreign manifest" "$work/o1"
cp -r "$work/run" "$work/run2"
rm "$(ls "$work"/run2/hidden/*.safetensors | head -1)"
expect_error "missing hidden file" 'hidden: cell[0-9]+\.[a-z_.0-9]+: hidden-vector tensor missing' \
  "$bin" analyze "$work/run2" --out "$work/o2"
no_file "missing hidden file" "$work/o2"
expect_error "mixed inputs" 'run artifacts and analysis-input files cannot be mixed' \
  "$bin" analyze "$work/run" "$work/m.json" --out "$work/o3"
finish

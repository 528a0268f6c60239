#!/usr/bin/env bash
# Hook edits as probe conditions (`interventions = [...]` in a [[condition]]): freeze writes each
# cell's edits with its own positions (an anchor, maybe offset, "target" = the interior tokens), run applies
# them to that cell's row only (patch:@CONDITION reads the same source's row of that condition) (the other cells of the batch give the bytes of a run without the
# edited conditions), run.json repeats them, audit passes; bad edits fail at freeze.
source "$(dirname "$0")/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
tiny_trace_protocol plain "$model" "$work/plain.toml"
cp "$work/plain.toml" "$work/edited.toml"
cat >> "$work/edited.toml" <<'TOML'

[[condition]]
name = "s0_ko"
history = "filler"
group = "s0"
interventions = ["blocks.1.moe.experts.0,1=route-out"]

[[condition]]
name = "s0_zt"
history = "filler"
group = "s0"
interventions = ["blocks.2.hook_resid_post@target=zero", "blocks.3.attn.hook_out@history_eos,history_eos+1,history_eos-2,0=scale:0.5"]

[[condition]]
name = "s0_period_px"
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "." }]
interventions = ["blocks.1.hook_resid_post=patch:@s0_eos"]
TOML
for p in plain edited; do
  "$bin" freeze "$work/$p.toml" --out "$work/$p.json" >/dev/null || bad "freeze $p"
  "$bin" run "$work/$p.json" --out "$work/$p" >/dev/null 2>&1 || bad "run $p"
done
"$bin" audit "$work/edited" >/dev/null 2>&1 && ok "audit of the edited run" || bad "audit of the edited run"
# A run.json whose cell lost its edits is caught (beside its content hash).
cp -r "$work/edited" "$work/tampered"
/usr/bin/python3 -c '
import json, sys
p = sys.argv[1] + "/tampered/run.json"
d = json.load(open(p))
next(c for c in d["cells"] if "interventions" in c).pop("interventions")
json.dump(d, open(p, "w"), indent=1)' "$work"
out="$("$bin" audit "$work/tampered" 2>&1)"; rc=$?
[[ $rc -eq 3 ]] && grep -q "interventions differ from the manifest's" <<<"$out" && ok "audit: a cell without its edits fails" \
  || bad "audit: a cell without its edits (rc $rc)"

/usr/bin/python3 - "$work" <<'PY' && ok "edits per cell: frozen, applied to their rows only, repeated in run.json" || bad "edits per cell"
import json, sys
w = sys.argv[1]
man = json.load(open(f"{w}/edited.json"))
plain_man = json.load(open(f"{w}/plain.json"))
assert all("interventions" not in c for c in plain_man["cells"])
assert all("interventions" not in c for c in plain_man["protocol"]["conditions"])
conds = {c["name"]: c for c in man["protocol"]["conditions"]}
assert conds["s0_ko"]["interventions"] == ["blocks.1.moe.experts.0,1=route-out"]
for c in man["cells"]:
    a, e = c["interior_token_range"]
    if c["condition"] == "s0_ko":
        assert c["interventions"] == ["blocks.1.moe.experts.0,1=route-out"], c["interventions"]
    elif c["condition"] == "s0_zt":
        eos = c["anchors"]["history_eos"]
        assert c["interventions"] == [f"blocks.2.hook_resid_post@{a}-{e - 1}=zero",
                                      f"blocks.3.attn.hook_out@{eos},{eos + 1},{eos - 2},0=scale:0.5"], c["interventions"]
    elif c["condition"] == "s0_period_px":
        assert c["interventions"] == ["blocks.1.hook_resid_post=patch:@s0_eos"]
    else:
        assert "interventions" not in c
run = {c["cell_id"]: c for c in json.load(open(f"{w}/edited/run.json"))["cells"]}
plain = {c["cell_id"]: c for c in json.load(open(f"{w}/plain/run.json"))["cells"]}
# The cells of the plain conditions: the same results (and headers) with edited rows beside them.
# (hidden_vectors names the cell's index, which the added conditions shift)
strip = lambda r: {k: v for k, v in r.items() if k != "hidden_vectors"}
for cid, c in plain.items():
    assert strip(run[cid]["result"]) == strip(c["result"]), cid
checked = 0
for cid, c in run.items():
    if c["condition"] == "s0_period_px":
        # Layer 1's residual from the s0_eos row of the same batch: from stage 2 on, that cell's
        # states and routes; before it, the edited input's (s0_period's).
        eos, period = run[cid.replace("s0_period_px", "s0_eos")], run[cid.replace("s0_period_px", "s0_period")]
        assert c["interventions"] == ["blocks.1.hook_resid_post=patch:@s0_eos"]
        assert c["input_ids"] == period["input_ids"] != eos["input_ids"]
        st = {s["stage"]: s for s in c["result"]["stages"]}
        assert all(st[s] == {x["stage"]: x for x in eos["result"]["stages"]}[s] for s in (2, 3, 4, 5))
        assert st[1] == {x["stage"]: x for x in period["result"]["stages"]}[1]
        assert [r for r in c["result"]["routes"] if r["layer"] >= 2] == [r for r in eos["result"]["routes"] if r["layer"] >= 2]
        checked += 1
        continue
    if c["condition"] not in ("s0_ko", "s0_zt"):
        continue
    assert c["interventions"] == man["cells"][c["index"]]["interventions"]
    base = run[cid.replace(c["condition"], "s0_eos")]  # the same ids without edits
    assert base["input_ids"] == c["input_ids"]
    st = {s["stage"]: s for s in c["result"]["stages"]}
    bst = {s["stage"]: s for s in base["result"]["stages"]}
    routes = {r["layer"]: r["topk_ids"] for r in c["result"]["routes"]}
    if c["condition"] == "s0_ko":
        assert st[1] == bst[1] and st[2]["full_sha256"] != bst[2]["full_sha256"]
        assert all(not ({0, 1} & set(tok)) for tok in routes[1]), routes[1]
    else:
        assert st[2] == bst[2] and st[3]["target_sha256"] != bst[3]["target_sha256"]
    checked += 1
assert checked >= 6, checked
PY

# Generate mode: the edited conditions' rows generate with their edits in every pass, the other
# rows of their batches as in a run without them.
for p in plain edited; do
  sed 's/^mode = "trace"/mode = "generate"\nmax_new_tokens = 6/; /^layers = /d; /^record_hidden_vectors/d' \
    "$work/$p.toml" > "$work/gen_$p.toml"
  sed -i 's/, "blocks.3.attn.hook_out@history_eos,history_eos+1,history_eos-2,0=scale:0.5"//; s/hook_resid_post=patch:@s0_eos/hook_resid_post@target=patch:@s0_eos/' \
    "$work/gen_$p.toml"
  "$bin" freeze "$work/gen_$p.toml" --out "$work/gen_$p.json" >/dev/null || bad "freeze gen_$p"
  "$bin" run "$work/gen_$p.json" --out "$work/gen_$p" >/dev/null 2>&1 || bad "run gen_$p"
done
/usr/bin/python3 - "$work" <<'PY' && ok "generate mode: edited rows change, the others do not" || bad "generate mode edits"
import json, sys
w = sys.argv[1]
run = {c["cell_id"]: c for c in json.load(open(f"{w}/gen_edited/run.json"))["cells"]}
plain = {c["cell_id"]: c for c in json.load(open(f"{w}/gen_plain/run.json"))["cells"]}
for cid, c in plain.items():
    assert run[cid]["result"] == c["result"], cid
changed = sum(run[cid]["result"]["generated_ids"] != run[cid.replace(run[cid]["condition"], "s0_eos")]["result"]["generated_ids"]
              for cid in run if run[cid]["condition"] in ("s0_ko", "s0_zt"))
assert changed >= 1, changed
# Layer 1's residual at the target tokens from the s0_eos row of the prompt pass.
man = json.load(open(f"{w}/gen_edited.json"))
px = [c for c in man["cells"] if c["condition"] == "s0_period_px"]
assert px and all(c["interventions"] == ["blocks.1.hook_resid_post@%d-%d=patch:@s0_eos" % (c["interior_token_range"][0],
                  c["interior_token_range"][1] - 1)] for c in px)
assert all("generated_ids" in run[c["cell_id"]]["result"] for c in px)
PY
# add:FILE in a condition (a steering vector at the target tokens): the path resolves against
# the protocol's directory and is recorded relative to the manifest's, the manifest pins the
# file's SHA-256 (intervention_files), the steered rows change from layer 2 on and the others do
# not; a manifest moved with its files runs from anywhere with the same results; a file changed
# after freezing is refused by run, a missing one by freeze (and by run, naming where it looked).
mkdir -p "$work/steer"
steering_vector "$work/steer/v.safetensors" "$model"
cp "$work/plain.toml" "$work/steer/steer.toml"
printf '\n[[condition]]\nname = "s0_steer"\nhistory = "filler"\ngroup = "s0"\ninterventions = ["blocks.1.hook_resid_post@target=add:v.safetensors*2"]\n' \
  >> "$work/steer/steer.toml"
"$bin" freeze "$work/steer/steer.toml" --out "$work/steer.json" >/dev/null && "$bin" run "$work/steer.json" --out "$work/steer_run" \
  >/dev/null 2>&1 && "$bin" audit "$work/steer_run" >/dev/null 2>&1 && ok "steered condition: froze, ran, audited" || bad "steered condition"
/usr/bin/python3 - "$work" <<'PY' && ok "steered cells: file pinned, rows steered, others untouched" || bad "steered cells"
import hashlib, json, sys
w = sys.argv[1]
man = json.load(open(f"{w}/steer.json"))
path = "steer/v.safetensors"  # relative to the manifest's directory, w
assert man["intervention_files"] == {path: hashlib.sha256(open(f"{w}/{path}", "rb").read()).hexdigest()}, man.get("intervention_files")
run = {c["cell_id"]: c for c in json.load(open(f"{w}/steer_run/run.json"))["cells"]}
plain = {c["cell_id"]: c for c in json.load(open(f"{w}/plain/run.json"))["cells"]}
strip = lambda r: {k: v for k, v in r.items() if k != "hidden_vectors"}
for cid, c in plain.items():
    assert strip(run[cid]["result"]) == strip(c["result"]), cid
n = 0
for c in man["cells"]:
    if c["condition"] != "s0_steer":
        continue
    a, e = c["interior_token_range"]
    assert c["interventions"] == [f"blocks.1.hook_resid_post@{a}-{e - 1}=add:{path}*2"], c["interventions"]
    st = run[c["cell_id"]]["result"]["stages"]
    base = run[c["cell_id"].replace("s0_steer", "s0_eos")]["result"]["stages"]
    assert st[1] == base[1] and st[2]["target_sha256"] != base[2]["target_sha256"]
    n += 1
assert n >= 2 and "intervention_files" not in json.load(open(f"{w}/plain.json"))
PY
grep -q '^PASS  hook-edit files = manifest.s pins: 1 files as the manifest pinned them' <("$bin" audit "$work/steer_run" 2>&1) \
  && ! "$bin" audit "$work/edited" 2>&1 | grep -q "hook-edit files" && ok "audit: the pinned steering file checks" || bad "audit of pinned files"
# The manifest and its files moved together (another machine, another checkout): run from another
# working directory finds the file beside the manifest, the cells' results are the same, and the
# audit checks the pin there; the manifest copied without its files is refused by run (naming
# the path it looked at), and a run whose pinned file is gone is audited with the pin SKIPped.
mkdir -p "$work/moved/elsewhere" "$work/bare"
cp -r "$work/steer" "$work/moved/steer" && cp "$work/steer.json" "$work/moved/steer.json" && cp "$work/steer.json" "$work/bare/steer.json"
(cd "$work/moved/elsewhere" && "$bin" run ../steer.json --out ../run >/dev/null 2>&1) \
  && grep -q '^PASS  hook-edit files = manifest.s pins: 1 files as the manifest pinned them' <("$bin" audit "$work/moved/run" 2>&1) \
  && /usr/bin/python3 - "$work" <<'PY' && ok "moved manifest and files: same results, pin audited" || bad "moved manifest and files"
import json, sys
w = sys.argv[1]
a = {c["cell_id"]: c["result"] for c in json.load(open(f"{w}/steer_run/run.json"))["cells"]}
b = {c["cell_id"]: c["result"] for c in json.load(open(f"{w}/moved/run/run.json"))["cells"]}
assert a == b
PY
expect_error "manifest moved without its files" "$work/bare/steer/v.safetensors: a hook edit's file of the manifest is not found" \
  "$bin" run "$work/bare/steer.json" --out "$work/bare/run"
no_file "manifest moved without its files" "$work/bare/run"
mv "$work/moved/steer/v.safetensors" "$work/moved/v.away"
out="$("$bin" audit "$work/moved/run" 2>&1)"
grep -q "^SKIP  hook-edit files = manifest.s pins: 0 files as pinned; not found here: $work/moved/steer/v.safetensors" <<<"$out" \
  && ok "audit: a pin whose file is absent is skipped" || bad "audit: absent pinned file: $out"
printf 'x' >> "$work/steer/v.safetensors"
out="$("$bin" audit "$work/steer_run" 2>&1)"; rc=$?
[[ $rc -eq 3 ]] && grep -q "^FAIL  hook-edit files = manifest.s pins: .*v.safetensors: sha256 .*, the manifest pinned" <<<"$out" \
  && ok "audit: a steering file changed after the run fails" || bad "audit: changed steering file (rc $rc)"
expect_error "steering file changed after freezing" "v.safetensors: sha256: differs from the one recorded when the manifest was frozen" \
  "$bin" run "$work/steer.json" --out "$work/steer_run2"
no_file "steering file changed after freezing" "$work/steer_run2"
sed -i 's/add:v.safetensors/add:nowhere.safetensors/' "$work/steer/steer.toml"
expect_error "steering file missing" "steer.toml: .*s0_steer: interventions\[0\]: .*nowhere.safetensors not found" \
  "$bin" freeze "$work/steer/steer.toml" --out "$work/steer2.json"
no_file "steering file missing" "$work/steer2.json"

# Generation: a patch from a sibling names its tokens (the sibling may stop first).
sed 's/hook_resid_post@target=patch:@s0_eos/hook_resid_post=patch:@s0_eos/' "$work/gen_edited.toml" > "$work/gen_all.toml"
expect_error "generate: sibling patch of every token" "a patch from a sibling in generation names its tokens" \
  "$bin" freeze "$work/gen_all.toml" --out "$work/gen_all.json"
no_file "generate: sibling patch of every token" "$work/gen_all.json"

# Bad edits fail at freeze, naming the protocol and the condition or cell; nothing is written.
bad_protocol() {
  cp "$work/plain.toml" "$work/bad.toml"
  printf '\n[[condition]]\nname = "s0_bad"\nhistory = "filler"\ngroup = "s0"\ninterventions = ["%s"]\n' "$1" >> "$work/bad.toml"
}
bad_protocol "blocks.2.hook_resid_post@nowhere=zero"
expect_error "unknown token name" "bad.toml: condition\[[0-9]+\].interventions\[0\]: .*unknown token \"nowhere\"" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post@history_eos+x=zero"
expect_error "malformed anchor offset" "unknown token \"history_eos\+x\" \(a position, A-B, target, or an anchor with an optional \+N / -N\)" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post@bos-1=zero"
expect_error "anchor offset before the first token" "s0_bad.*interventions\[0\]: .*bos-1 is position -1, outside the cell's [0-9]+ tokens" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post=patch:x.safetensors"
expect_error "patch from a file in a protocol" "patch from a sibling cell \(patch:@CONDITION\), not from files" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post=add:*2"
expect_error "add without a file" "add: needs a safetensors file" "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post=patch:@s9"
expect_error "patch from an unknown condition" "no condition named \"s9\"" "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.2.hook_resid_post=patch:@s0_bad"
expect_error "patch from itself" "a cell cannot patch from itself" "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
cp "$work/plain.toml" "$work/bad.toml"
printf '\n[[condition]]\nname = "short"\nhistory = "none"\ninterventions = ["blocks.1.hook_resid_post=patch:@s0_eos"]\n' >> "$work/bad.toml"
expect_error "patch from a sibling of another length" "short: interventions\[0\]: .*the s0_eos cell has [0-9]+ tokens; patching every token needs [0-9]+" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.9.hook_resid_post=zero"
expect_error "layer the model lacks" "bad.toml: .*s0_bad: --intervene 'blocks.9.hook_resid_post=zero': layer 9 is not run" \
  "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
bad_protocol "blocks.1.moe.experts.0=route-out"
sed -i 's/^mode = "trace"/mode = "generate"\nmax_new_tokens = 2/; /^layers = /d; /^record_hidden_vectors/d' "$work/bad.toml"
sed -i 's/experts.0=route-out/experts.0=route-out", "logits=zero/' "$work/bad.toml"
expect_error "generation cannot edit logits" "generation cannot edit logits" "$bin" freeze "$work/bad.toml" --out "$work/bad.json"
no_file "bad edits" "$work/bad.json"
finish

#!/usr/bin/env bash
# atlas direction on a tiny probe run with hidden vectors: the vector is mean(condition) -
# mean(reference) of the stage's target rows (recomputed here from the side files), named as the
# stage's hook so `--intervene HOOK=add:FILE` takes it, byte-identical across runs, normalised on
# request; bad stages, conditions and runs are one clear error with no output.
source "$(dirname "$0")/../cli/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
tiny_trace_protocol dir "$model" "$work/p.toml"
"$bin" freeze "$work/p.toml" --out "$work/m.json" >/dev/null && "$bin" run "$work/m.json" --out "$work/run" >/dev/null 2>&1 \
  || { bad "freeze and run"; finish; }
"$bin" direction "$work/run" --stage layer.01 --condition s0_period --reference s0_eos --out "$work/v.safetensors" \
  >"$work/out" 2>&1 && ok "direction written" || bad "direction: $(cat "$work/out")"
"$bin" direction "$work/run" --stage blocks.1.hook_resid_post --condition s0_period --reference s0_eos \
  --out "$work/v2.safetensors" >/dev/null 2>&1 || bad "direction by hook name"
"$bin" direction "$work/run" --stage layer.01 --condition s0_period --reference s0_eos --manifest "$work/m.json" \
  --out "$work/v3.safetensors" >/dev/null 2>&1 && ok "direction checked against the manifest" || bad "direction --manifest"
cmp -s "$work/v.safetensors" "$work/v2.safetensors" && ok "stage by hook name, again: the same bytes" || bad "direction bytes differ"
"$bin" direction "$work/run" --stage layer.01 --condition s0_period --reference s0_eos --normalize \
  --out "$work/u.safetensors" >/dev/null 2>&1 || bad "direction --normalize"
/usr/bin/python3 - "$work" <<'PY' && ok "the mean difference of the side files' rows, named as the hook" || bad "direction values"
import json, math, os, struct, sys
w = sys.argv[1]
def read(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["shape"], struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b]))
    return out, h.get("__metadata__", {})
side = {}
for f in sorted(os.listdir(f"{w}/run/hidden")):
    side.update(read(f"{w}/run/hidden/{f}")[0])
run = json.load(open(f"{w}/run/run.json"))
sums, rows = {}, {}
for c in run["cells"]:
    cond = c["condition"]
    if cond not in ("s0_period", "s0_eos"):
        continue
    shape, vals = side[c["result"]["hidden_vectors"]["tensor_prefix"] + "layer.01"]
    H = shape[1]
    s = sums.setdefault(cond, [0.0] * H)
    for r in range(shape[0]):
        for j in range(H):
            s[j] += vals[r * H + j]
    rows[cond] = rows.get(cond, 0) + shape[0]
want = [sums["s0_period"][j] / rows["s0_period"] - sums["s0_eos"][j] / rows["s0_eos"] for j in range(H)]
got, meta = read(f"{w}/v.safetensors")
assert list(got) == ["blocks.1.hook_resid_post"] and got["blocks.1.hook_resid_post"][0] == [H]
v = got["blocks.1.hook_resid_post"][1]
norm = math.sqrt(sum(x * x for x in want))
assert norm > 0
assert all(abs(a - b) <= 1e-6 * norm for a, b in zip(v, want)), max(abs(a - b) for a, b in zip(v, want))
assert meta["kind"] == "atlas.direction" and meta["stage"] == "layer.01" and meta["manifest_sha256"] == run["manifest_sha256"]
assert json.loads(meta["rows"]) == {"condition": rows["s0_period"], "reference": rows["s0_eos"]}
assert abs(float(meta["norm"]) - norm) <= 1e-9 * norm and meta["normalized"] == "false"
u = read(f"{w}/u.safetensors")[0]["blocks.1.hook_resid_post"][1]
assert abs(math.sqrt(sum(x * x for x in u)) - 1) < 1e-6
assert all(abs(a - b / norm) <= 1e-6 for a, b in zip(u, want))
PY
# The written file is an add: source as it stands.
"$bin" trace --model "$model" --ids 1000,5,17,42 --json "$work/t.json" \
  --intervene "blocks.1.hook_resid_post=add:$work/v.safetensors*3" >/dev/null 2>&1 && ok "trace takes it as add:FILE" \
  || bad "trace --intervene add: of the direction"

expect_error "unknown stage" "--stage: no stage \"layer.09\" in the runs" \
  "$bin" direction "$work/run" --stage layer.09 --condition s0_period --reference s0_eos --out "$work/x.safetensors"
expect_error "unknown condition" "--condition: no condition \"nope\" in the runs \(s0_eos, s0_post, s0_period\)" \
  "$bin" direction "$work/run" --stage layer.01 --condition nope --reference s0_eos --out "$work/x.safetensors"
expect_error "same condition twice" "--reference: the same condition as --condition" \
  "$bin" direction "$work/run" --stage layer.01 --condition s0_eos --reference s0_eos --out "$work/x.safetensors"
expect_error "not a run" "run.json" \
  "$bin" direction "$work" --stage layer.01 --condition s0_period --reference s0_eos --out "$work/x.safetensors"
no_file "bad direction inputs" "$work/x.safetensors"
finish

#!/usr/bin/env bash
# make-model / inspect / manifest end to end: determinism, verification, partial loading,
# and bad input (each a non-zero exit, an error naming the file and field, no output left).
set -u
bin="${ATLAS_BIN:?}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAILED: $*"; fails=$((fails+1)); }
ok() { "$@" >"$tmp/out" 2>"$tmp/err" || { bad "$* (exit $?): $(cat "$tmp/err")"; }; }
# must_fail PATTERN... -- CMD...: non-zero exit and stderr containing every pattern.
must_fail() {
  local pats=()
  while [[ "$1" != "--" ]]; do pats+=("$1"); shift; done
  shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then bad "unexpected success: $*"; return; fi
  for p in "${pats[@]}"; do
    grep -qF -- "$p" "$tmp/err" || bad "stderr of '$*' lacks '$p': $(cat "$tmp/err")"
  done
}

for verb in make-model inspect manifest; do
  "$bin" $verb --help >/dev/null 2>&1 || bad "$verb --help"
done

# --- make-model: byte-identical reruns, seeds differ, output verifies -------------------
ok "$bin" make-model --preset tiny --seed 0 "$tmp/a"
ok "$bin" make-model --preset tiny --seed 0 "$tmp/b"
ok "$bin" make-model --preset tiny --seed 1 "$tmp/c"
for f in config.json generation_config.json model.safetensors; do
  cmp -s "$tmp/a/$f" "$tmp/b/$f" || bad "make-model is not deterministic: $f differs"
done
cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" && bad "seeds 0 and 1 gave identical weights"
size=$(stat -c %s "$tmp/a/model.safetensors")
((size > 500000 && size < 1500000)) || bad "tiny model.safetensors is $size bytes, expected about 1 MB"
ok "$bin" inspect "$tmp/a"
grep -q "verification OK" "$tmp/out" || bad "inspect of a fresh tiny model did not report OK"
grep -q "^loaded deepseek_v2: 4 layers (1 dense, 3 MoE)" "$tmp/out" || bad "inspect lacks the one-line summary"
ok "$bin" inspect "$tmp/a" --json
/usr/bin/python3 - "$tmp/out" <<'PY' || bad "inspect --json content"
import json, sys
j = json.load(open(sys.argv[1]))
v = j["verification"]
assert v["ok"] and v["layout"] == "single" and v["weights_present"], v
assert j["architecture"]["dense_layers"] == [0] and j["architecture"]["moe_layers"] == [1, 2, 3], j["architecture"]
assert j["architecture"]["rope"]["scaling"]["factor"] == 4
assert v["by_dtype"]["BF16"]["bytes"] == v["total_bytes"] == 2 * v["by_dtype"]["BF16"]["params"]
PY
ok "$bin" make-model --preset tiny --dtype f32 "$tmp/f32"
ok "$bin" inspect "$tmp/f32" --json
grep -q '"F32"' "$tmp/out" || bad "--dtype f32 did not give F32 tensors"

# Refuses a non-empty OUT_DIR without --force and leaves it untouched; --force replaces.
before=$(sha256sum "$tmp/c/model.safetensors")
must_fail "$tmp/c" "not empty" "--force" -- "$bin" make-model --preset tiny --seed 0 "$tmp/c"
[[ "$(sha256sum "$tmp/c/model.safetensors")" == "$before" ]] || bad "refused make-model still changed OUT_DIR"
ok "$bin" make-model --preset tiny --seed 0 "$tmp/c" --force
cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" || bad "--force did not rewrite the weights"

# Bad flags: non-zero exit, no output directory left behind.
must_fail "--dtype" "int8" -- "$bin" make-model --preset tiny --dtype int8 "$tmp/nope1"
must_fail "--preset" "huge" -- "$bin" make-model --preset huge "$tmp/nope2"
[[ -e "$tmp/nope1" || -e "$tmp/nope2" ]] && bad "failed make-model left an output directory"

# --- partial loading: a sharded tiny model missing a shard that layers 0-1 do not need ----
ok "$bin" make-model --preset tiny --max-shard-size 100000 "$tmp/sh"
last=$(ls "$tmp/sh"/model-*.safetensors | sort | tail -1)
grep -q "model.layers.3" <(/usr/bin/python3 -c "import json,sys; ix=json.load(open('$tmp/sh/model.safetensors.index.json'))['weight_map']; print('\n'.join(k for k,v in ix.items() if v=='$(basename "$last")'))") \
  || bad "test setup: the last shard does not hold layer 3"
rm "$last"
ok "$bin" inspect "$tmp/sh" --layers 0-1
grep -q "verification OK" "$tmp/out" || bad "--layers 0-1 did not verify without the unneeded shard"
must_fail "$(basename "$last")" "missing shard" -- "$bin" inspect "$tmp/sh"
must_fail "--layers" -- "$bin" inspect "$tmp/sh" --layers 2-3

# --- bad checkpoints: inspect exits non-zero naming file and tensor/field ---------------
cp -r "$tmp/a" "$tmp/trunc"
truncate -s -100 "$tmp/trunc/model.safetensors"
must_fail "$tmp/trunc/model.safetensors" "truncated" "model.layers.3.post_attention_layernorm.weight" -- "$bin" inspect "$tmp/trunc"
grep -q "more)" "$tmp/err" && bad "a truncated file should be one problem, not one per tensor: $(cat "$tmp/err")"
cp -r "$tmp/a" "$tmp/cfg"
sed -i 's/"scoring_func": "softmax"/"scoring_func": "sigmoid"/' "$tmp/cfg/config.json"
must_fail "$tmp/cfg/config.json" "scoring_func" "sigmoid" -- "$bin" inspect "$tmp/cfg"
sed -i '/"hidden_size"/d' "$tmp/cfg/config.json"
must_fail "$tmp/cfg/config.json" "hidden_size" -- "$bin" inspect "$tmp/cfg"
must_fail "$tmp/empty" -- "$bin" inspect "$tmp/empty"

# --- manifest ---------------------------------------------------------------------------
ok "$bin" manifest "$tmp/a" --out "$tmp/pins.json"
ok "$bin" manifest "$tmp/b" --out "$tmp/pins_b.json"
cmp -s "$tmp/pins.json" "$tmp/pins_b.json" || bad "manifests of identical directories differ"
grep -q "$(sha256sum "$tmp/a/model.safetensors" | cut -d' ' -f1)" "$tmp/pins.json" || bad "manifest lacks the weights' sha256"
ok "$bin" inspect "$tmp/a" --manifest "$tmp/pins.json"
n_files=$(find "$tmp/a" -maxdepth 1 -type f ! -name '.*' | wc -l)  # weights, configs, tokenizer files
grep -q "$n_files file(s) match" "$tmp/out" || bad "inspect --manifest did not report $n_files pinned files"
# Written inside the directory, the manifest does not list itself.
ok "$bin" manifest "$tmp/b" --out "$tmp/b/MANIFEST.json"
grep -q "MANIFEST" "$tmp/b/MANIFEST.json" && bad "manifest lists itself"
echo '{"eos_token_id": 7}' >"$tmp/c/generation_config.json"
must_fail "$tmp/c/generation_config.json" "sha256" -- "$bin" inspect "$tmp/c" --manifest "$tmp/pins.json"
must_fail "$tmp/no/such" -- "$bin" manifest "$tmp/no/such" --out "$tmp/m2.json"
[[ -e "$tmp/m2.json" ]] && bad "failed manifest left its output file"
# A directory with nothing to pin (only hidden files) would give a manifest that verifies anything.
mkdir -p "$tmp/empty_dir" && : > "$tmp/empty_dir/.hidden"
must_fail "$tmp/empty_dir" "no files to pin" -- "$bin" manifest "$tmp/empty_dir" --out "$tmp/m3.json"
[[ -e "$tmp/m3.json" ]] && bad "manifest of an empty directory left its output file"

echo "$fails failed"
exit $((fails > 0))

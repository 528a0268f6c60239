#!/usr/bin/env bash
# atlas trace on the embedded tiny checkpoint and on a reference fixture: outputs, determinism
# (byte-identical artifacts outside "runtime" across runs and thread counts), partial layers,
# and bad input (clear error, non-zero exit, no output file).
source "$(dirname "$0")/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }

ids="1000,5,17,42,300,7,7,9,11,600,2,3"
"$bin" trace --model "$model" --ids "$ids" --dump "$work/a.safetensors" --json "$work/a.json" --threads 1 >/dev/null \
  && ok "trace runs" || bad "trace runs"
"$bin" trace --model "$model" --ids "$ids" --dump "$work/b.safetensors" --json "$work/b.json" --threads 2 >/dev/null
cmp -s "$work/a.safetensors" "$work/b.safetensors" && ok "dump byte-identical across runs/threads" || bad "dump differs"
strip() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("runtime"); print(json.dumps(d, sort_keys=True))' "$1"; }
[[ "$(strip "$work/a.json")" == "$(strip "$work/b.json")" ]] && ok "json identical outside runtime" || bad "json differs"

# Structure: 4 layers -> hidden.0..5 (6 stages), 3 MoE gates, tensors named as documented.
/usr/bin/python3 - "$work/a.json" "$work/a.safetensors" <<'PY' && ok "trace structure" || bad "trace structure"
import json, struct, sys
d = json.load(open(sys.argv[1]))
assert [s["name"] for s in d["stages"]] == [f"hidden.{i}" for i in range(6)], d["stages"]
assert [g["layer"] for g in d["gates"]] == [1, 2, 3]
for g in d["gates"]:
    assert sum(g["load"]) == 12 * 3 and len(g["load"]) == 8
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
names = set(h) - {"__metadata__"}
want = {f"hidden.{i}" for i in range(6)} | {"logits"} | {f"mla.{l}.latent" for l in range(4)}
want |= {f"router.{l}.{k}" for l in (1, 2, 3) for k in ("logits", "topk_ids", "topk_weights")}
assert names == want, names ^ want
assert h["hidden.0"]["shape"] == [12, 64] and h["hidden.0"]["dtype"] == "F32"
assert h["router.1.topk_ids"]["dtype"] == "I32" and h["router.1.topk_ids"]["shape"] == [12, 3]
assert h["mla.0.latent"]["shape"] == [12, 40] and h["logits"]["shape"] == [12, 1024]
PY

# A bad ATLAS_* switch of the CUDA backend: one error naming it, before any GPU is looked for
# (so on this machine too), no output file. Skipped where atlas was built without CUDA.
err="$(ATLAS_WIDE_NORM=2 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json" 2>&1 >/dev/null)"
if grep -q "built without CUDA" <<<"$err"; then
  echo "skip bad CUDA switch: this atlas was built without CUDA"
else
  expect_error "bad CUDA switch" "ATLAS_WIDE_NORM: expected 0 or 1, got '2'" \
    env ATLAS_WIDE_NORM=2 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad CUDA switch" "$work/env.json"
  # The model's measurement settings too (parsed with the switches, before the GPU lookup).
  expect_error "bad chunk setting" "ATLAS_PREFILL_CHUNK_TOKENS: expected a whole number of tokens from 1 to 999999999, got '0'" \
    env ATLAS_PREFILL_CHUNK_TOKENS=0 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad chunk setting" "$work/env.json"
  # A GEMM config override that names a config the grouped GEMM may not take.
  expect_error "bad grouped config" "ATLAS_GEMM_GROUPED_FEW_DOWN: 'wg128x128x64/4' is not the name of a config with mma.sync tiles" \
    env ATLAS_GEMM_GROUPED_FEW_DOWN=wg128x128x64/4 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad grouped config" "$work/env.json"
  # Session 21's switches: the dense split-K config and the early weight staging.
  expect_error "bad split-K config" "ATLAS_GEMM_SPLITK: '16x32x128/4' is not a split-K config name" \
    env ATLAS_GEMM_SPLITK=16x32x128/4 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad split-K config" "$work/env.json"
  # Session 23's values of the stream switches: a near miss is one error naming the variable.
  expect_error "bad stream config" "ATLAS_GEMM_STREAM: expected 0 .* or wg .*, got 'WG'" \
    env ATLAS_GEMM_STREAM=WG "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad stream config" "$work/env.json"
  expect_error "bad grouped stream config" "ATLAS_GEMM_STREAM_GROUPED: expected 0, 1, wg, wg-gate, wg-gate3, wg-split, split-gate or split-gate3, got 'wg-down'" \
    env ATLAS_GEMM_STREAM_GROUPED=wg-down "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad grouped stream config" "$work/env.json"
  expect_error "bad L2 prefetch setting" "ATLAS_L2_PREFETCH: expected none, gate_up, down or both, got 'all'" \
    env ATLAS_L2_PREFETCH=all "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad L2 prefetch setting" "$work/env.json"
  expect_error "bad down blocks setting" "ATLAS_GEMM_DOWN_BLOCKS_PER_SM: expected 1, 2, 3 or 4 .blocks per SM., got '0'" \
    env ATLAS_GEMM_DOWN_BLOCKS_PER_SM=0 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad down blocks setting" "$work/env.json"
  expect_error "bad stream-K grid" "ATLAS_GEMM_STREAMK_GRID: expected a whole number of blocks from 1 to 4096 .unset: every resident slot., got '0'" \
    env ATLAS_GEMM_STREAMK_GRID=0 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad stream-K grid" "$work/env.json"
  expect_error "bad combine setting" "ATLAS_COMBINE_QKV: expected 0, 1, flag or event, got 'fused'" \
    env ATLAS_COMBINE_QKV=fused "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad combine setting" "$work/env.json"
  expect_error "bad router norm setting" "ATLAS_ROUTER_NORM: expected 0, 1 or joined, got 'norm'" \
    env ATLAS_ROUTER_NORM=norm "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad router norm setting" "$work/env.json"
  expect_error "bad capture edges setting" "ATLAS_CAPTURE_EDGES: expected add, explicit or plain, got 'all'" \
    env ATLAS_CAPTURE_EDGES=all "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad capture edges setting" "$work/env.json"
  expect_error "bad shared fork setting" "ATLAS_SHARED_FORK: expected norm or o_proj, got 'router'" \
    env ATLAS_SHARED_FORK=router "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad shared fork setting" "$work/env.json"
  expect_error "bad block stamps file" "ATLAS_BLOCK_STAMPS: expected a file in an existing directory, got '$work/none/s.csv'" \
    env ATLAS_BLOCK_STAMPS="$work/none/s.csv" "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad block stamps file" "$work/env.json"
  # Config-name overrides (session 49): the gate|up's must fuse the SiLU (not split-K), the down's
  # must be a dense config (not grouped-only).
  for bad_config in ATLAS_GEMM_WIDE_GATED=splitk16x8/8w ATLAS_GEMM_LONG_K=32x64x128/4; do
    expect_error "bad ${bad_config%%=*} config" "${bad_config%%=*}: '${bad_config#*=}' is not the name of a dense config" \
      env "$bad_config" "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
    no_file "bad ${bad_config%%=*} config" "$work/env.json"
  done
  # CUDA_DEVICE_MAX_CONNECTIONS (session 65: atlas sets 32 where it is unset): 1 to 32.
  expect_error "bad CUDA_DEVICE_MAX_CONNECTIONS" "CUDA_DEVICE_MAX_CONNECTIONS: expected a whole number of work queues from 1 to 32, got '64'" \
    env CUDA_DEVICE_MAX_CONNECTIONS=64 "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad CUDA_DEVICE_MAX_CONNECTIONS" "$work/env.json"
  # Stream-K's problems (session 52).
  expect_error "bad ATLAS_GEMM_STREAMK" "ATLAS_GEMM_STREAMK: expected 0 [(]off[)], wide .* got 'both'" \
    env ATLAS_GEMM_STREAMK=both "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad ATLAS_GEMM_STREAMK" "$work/env.json"
  # Where the MLA cluster kernel releases the next launch under the pair merge (session 70).
  expect_error "bad ATLAS_MLA_PAIR_RELEASE" "ATLAS_MLA_PAIR_RELEASE: expected wait, phase2, epilogue or exit, got 'late'" \
    env ATLAS_MLA_PAIR_RELEASE=late "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
  no_file "bad ATLAS_MLA_PAIR_RELEASE" "$work/env.json"
  # On/off switches of sessions 21-23 (env_switch): one error naming the variable, no file.
  for bad_switch in ATLAS_GEMM_STAGE_EARLY=yes ATLAS_GEMM_CLUSTER_EARLY=on ATLAS_MLA_EARLY_CACHE=true \
    ATLAS_GEMM_STREAM_BALANCE=even ATLAS_GEMM_TAILS=yes ATLAS_MOE_SELF_ROUTE=self ATLAS_GEMM_TIGHT_TILES=tight ATLAS_ROUTE_CLUSTER=on ATLAS_GEMM_WIDE_SPLITK4=4w \
    ATLAS_MOE_DOWN_EARLY=early ATLAS_COMBINE_DIRECT=rows ATLAS_RUN_FUSED=fused ATLAS_RUN_ROOT=root ATLAS_DEVICE_EDITS=host ATLAS_CACHE_POOL=keep ATLAS_EARLY_GRAPHS=early ATLAS_MLA_PAIR_MERGE=pair; do
    expect_error "bad ${bad_switch%%=*} switch" "${bad_switch%%=*}: expected 0 or 1, got '${bad_switch#*=}'" \
      env "$bad_switch" "$bin" trace --backend cuda --model "$model" --ids "$ids" --json "$work/env.json"
    no_file "bad ${bad_switch%%=*} switch" "$work/env.json"
  done
fi

# --layers 0-1: three hidden stages equal to the full run's, no logits.
"$bin" trace --model "$model" --ids "$ids" --layers 0-1 --json "$work/p.json" >/dev/null
/usr/bin/python3 - "$work/a.json" "$work/p.json" <<'PY' && ok "partial layers" || bad "partial layers"
import json, sys
a, p = (json.load(open(f)) for f in sys.argv[1:])
assert [s["sha256"] for s in p["stages"]] == [s["sha256"] for s in a["stages"][:3]]
assert len(p["gates"]) == 1 and "logits" not in p
PY

# bf16 mode differs from f32 but is itself reproducible.
"$bin" trace --model "$model" --ids "$ids" --compute bf16 --json "$work/c.json" >/dev/null
"$bin" trace --model "$model" --ids "$ids" --compute bf16 --json "$work/d.json" >/dev/null
[[ "$(strip "$work/c.json")" == "$(strip "$work/d.json")" ]] && ok "bf16 reproducible" || bad "bf16 not reproducible"
[[ "$(strip "$work/a.json")" != "$(strip "$work/c.json")" ]] && ok "bf16 differs from f32" || bad "bf16 == f32"

# Bad input.
expect_error "out-of-vocabulary id" "--ids.*1024 is outside the vocabulary" \
  "$bin" trace --model "$model" --ids 1,1024 --json "$work/x.json"
no_file "out-of-vocabulary id" "$work/x.json"
expect_error "malformed id list" "--ids.*abc" "$bin" trace --model "$model" --ids 1,abc --dump "$work/y.safetensors"
no_file "malformed id list" "$work/y.safetensors"
expect_error "unknown compute" "--compute.*fp8" "$bin" trace --model "$model" --ids 1 --compute fp8
expect_error "bad layer range" "--layers" "$bin" trace --model "$model" --ids 1 --layers 2-3
expect_error "missing model" "config.json" "$bin" trace --model "$work/none" --ids 1
cp -r "$model" "$work/trunc"
sz=$(stat -c %s "$work/trunc/model.safetensors"); truncate -s $((sz - 100)) "$work/trunc/model.safetensors"
expect_error "truncated shard" "model.safetensors" "$bin" trace --model "$work/trunc" --ids 1 --json "$work/z.json"
no_file "truncated shard" "$work/z.json"
/usr/bin/python3 - "$work/trunc/config.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["scoring_func"] = "sigmoid"; json.dump(d, open(sys.argv[1], "w"))
PY
expect_error "unsupported config value" "config.json: scoring_func" "$bin" trace --model "$work/trunc" --ids 1
# --input: several sequences through one loaded model; each dump is byte-identical to the
# single-sequence trace of the same ids (the model state does not leak between sequences).
printf '{"id": "a", "ids": [1, 5, 9, 2]}\n{"id": "b", "ids": [7, 3]}\n' >"$work/seqs.jsonl"
"$bin" trace --model "$model" --input "$work/seqs.jsonl" --out-dir "$work/multi" >/dev/null 2>&1 || bad "trace --input"
"$bin" trace --model "$model" --ids 7,3 --dump "$work/b1.safetensors" >/dev/null 2>&1 || bad "trace --ids 7,3"
cmp -s "$work/multi/b.safetensors" "$work/b1.safetensors" && ok "--input dump equals the single trace" \
  || bad "--input dump differs from the single trace"
[[ -s "$work/multi/a.json" && -s "$work/multi/a.safetensors" ]] && ok "--input writes one dump + summary per line" || bad "--input outputs"
# An output name that is a directory (here the second sequence's summary) is refused before any
# sequence runs, so no earlier sequence's files are left behind either.
mkdir -p "$work/blocked/b.json"
expect_error "--input output name is a directory" "blocked/b.json: --out-dir: is a directory" \
  "$bin" trace --model "$model" --input "$work/seqs.jsonl" --out-dir "$work/blocked"
no_file "--input output name is a directory" "$work/blocked/a."
printf '{"id": "a", "ids": [1]}\n{"id": "a", "ids": [2]}\n' >"$work/dup.jsonl"
expect_error "duplicate --input id" "dup.jsonl:2: id" "$bin" trace --model "$model" --input "$work/dup.jsonl" --out-dir "$work/zz_out"
no_file "duplicate --input id" "$work/zz_out"
printf '{"id": "x", "ids": [1, 999999]}\n' >"$work/big.jsonl"
expect_error "--input id out of vocabulary" "big.jsonl:1.*outside the vocabulary" "$bin" trace --model "$model" --input "$work/big.jsonl" --out-dir "$work/d"
expect_error "--input without --out-dir" "--out-dir" "$bin" trace --model "$model" --input "$work/seqs.jsonl"
# --attention absorbed (CPU): the same math as the expanded form, another rounding order.
"$bin" trace --model "$model" --ids 1,5,9,2,7,3 --dump "$work/ex.safetensors" >/dev/null 2>&1 || bad "trace expanded"
"$bin" trace --model "$model" --ids 1,5,9,2,7,3 --attention absorbed --dump "$work/ab.safetensors" --json "$work/ab.json" >/dev/null 2>&1 || bad "trace absorbed"
/usr/bin/python3 - "$work/ex.safetensors" "$work/ab.safetensors" "$work/ab.json" <<'PY' && ok "absorbed trace within 1e-4 of expanded (f32)" || bad "absorbed trace differs"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4), d[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert json.load(open(sys.argv[3]))["attention"] == "absorbed"
stages = [k for k in a if k.startswith("hidden.")]
assert stages and a.keys() == b.keys()
for k in stages:
    num = sum((x - y) ** 2 for x, y in zip(a[k], b[k])) ** 0.5; den = sum(x * x for x in a[k]) ** 0.5
    assert num <= 1e-4 * den, (k, num / den)
assert any(a[k] != b[k] for k in stages[1:]), "absorbed gave the same bits: was it used?"
PY
expect_error "unknown attention form" "--attention.*sideways" "$bin" trace --model "$model" --ids 1 --attention sideways
# Two outputs: a bad --json is found before the --dump is written (none of either is left).
expect_error "--json into a missing directory" "none/t.json: --json: the directory .* does not exist" \
  "$bin" trace --model "$model" --ids 1,2 --dump "$work/two.safetensors" --json "$work/none/t.json"
no_file "--json into a missing directory" "$work/two.safetensors"
mkdir -p "$work/adir"
expect_error "--json naming a directory" "adir: --json: is a directory" \
  "$bin" trace --model "$model" --ids 1,2 --dump "$work/two.safetensors" --json "$work/adir"
no_file "--json naming a directory" "$work/two.safetensors"
expect_error "negative --threads" "--threads: .*got -1" "$bin" trace --model "$model" --ids 1 --threads -1 --json "$work/th.json"
no_file "negative --threads" "$work/th.json"
# --input ids are checked, not wrapped (2^32 + 1 -> 1) or truncated (1.5 -> 1).
printf '{"id": "w", "ids": [1, 4294967297]}\n' >"$work/wrap.jsonl"
expect_error "--input id past int32" "wrap.jsonl:1: ids: .*4294967297" "$bin" trace --model "$model" --input "$work/wrap.jsonl" --out-dir "$work/wrap_out"
no_file "--input id past int32" "$work/wrap_out"
printf '{"id": "f", "ids": [1.5]}\n' >"$work/float.jsonl"
expect_error "--input fractional id" "float.jsonl:1: ids: .*1.5" "$bin" trace --model "$model" --input "$work/float.jsonl" --out-dir "$work/float_out"
no_file "--input fractional id" "$work/float_out"
expect_error "--out-dir naming a file" "seqs.jsonl: .*Not a directory" \
  "$bin" trace --model "$model" --input "$work/seqs.jsonl" --out-dir "$work/seqs.jsonl"
# Token ids need no tokenizer: --ids and --input work on a model directory without one.
cp -r "$model" "$work/notok" && rm "$work/notok"/tokenizer*.json
"$bin" trace --model "$work/notok" --ids 7,3 --dump "$work/nt.safetensors" >/dev/null 2>&1 \
  && cmp -s "$work/nt.safetensors" "$work/b1.safetensors" && ok "--ids without tokenizer files" || bad "--ids without tokenizer files"
"$bin" trace --model "$work/notok" --input "$work/seqs.jsonl" --out-dir "$work/nt_multi" >/dev/null 2>&1 \
  && cmp -s "$work/nt_multi/b.safetensors" "$work/b1.safetensors" && ok "--input without tokenizer files" || bad "--input without tokenizer files"
expect_error "--text without tokenizer files" "notok/tokenizer.json: --text needs a tokenizer" "$bin" trace --model "$work/notok" --text hi
finish

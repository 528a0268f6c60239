#!/usr/bin/env bash
# atlas trace / generate with --backend cuda. Without a GPU (or a build without CUDA): one clear
# error and a non-zero exit, no output file. With a GPU: the trace runs, its stages agree with
# the CPU bf16 trace within the stated tolerance, and bf16-only is enforced.
source "$(dirname "$0")/../cli/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
ids="1000,5,17,42,300,7,7,9,11,600,2,3"
has_gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU && has_gpu=1
if [[ $has_gpu -eq 0 ]]; then
  expect_error "trace --backend cuda without a GPU" "no CUDA device|built without CUDA" \
    "$bin" trace --backend cuda --compute bf16 --model "$model" --ids "$ids" --json "$work/c.json"
  no_file "trace --backend cuda without a GPU" "$work/c.json"
  printf '{"id":"a","ids":[1,2,3]}\n' >"$work/p.jsonl"
  expect_error "generate --backend cuda without a GPU" "no CUDA device|built without CUDA" \
    "$bin" generate --backend cuda --compute bf16 --model "$model" --prompts "$work/p.jsonl" --out "$work/g.jsonl" \
    --max-new-tokens 2
  no_file "generate --backend cuda without a GPU" "$work/g.jsonl"
  echo "(no GPU: the GPU half of this test did not run)"
  finish
fi
expect_error "cuda rejects --compute f32" "--compute" "$bin" trace --backend cuda --model "$model" --ids "$ids"
"$bin" trace --backend cuda --compute bf16 --model "$model" --ids "$ids" --dump "$work/g.safetensors" >/dev/null \
  && ok "trace --backend cuda runs" || bad "trace --backend cuda"
"$bin" trace --backend cpu --compute bf16 --model "$model" --ids "$ids" --dump "$work/c.safetensors" >/dev/null
/usr/bin/python3 - "$work/g.safetensors" "$work/c.safetensors" <<'PY' && ok "cuda trace within 0.12 of cpu bf16" || bad "cuda vs cpu trace"
import json, struct, sys
def load(p):  # F32 tensors only (plain struct: GPU machines may lack numpy)
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__" or v["dtype"] != "F32": continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out
g, c = load(sys.argv[1]), load(sys.argv[2])
assert set(g) == set(c), set(g) ^ set(c)
for k in sorted(g):
    if k.startswith("hidden.") or k == "logits":
        err = max(abs(x - y) for x, y in zip(g[k], c[k])) / max(max(abs(y) for y in c[k]), 1e-30)
        print(f"  {k}: rel {err:.4g}")
        assert err <= 0.12, k
PY
finish

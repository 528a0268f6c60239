#!/usr/bin/env bash
# atlas trace / generate with --backend cuda. Without a GPU (or a build without CUDA): one clear
# error and a non-zero exit, no output file. With a GPU: the bf16 trace agrees with the CPU bf16
# trace within the stated tolerance, and the f32 checking mode's trace (--compute f32) with the
# CPU f32 trace in the absorbed form (what the CUDA backend runs) within 1e-5 relative L2 per
# tensor, routes identical. Either way --fast with --compute f32 is refused naming --fast.
source "$(dirname "$0")/../cli/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
ids="1000,5,17,42,300,7,7,9,11,600,2,3"
printf '{"id":"a","ids":[1,2,3]}\n' >"$work/p.jsonl"
# The fast mode (cuBLASLt) is bf16-only: refused before any GPU is looked for.
expect_error "generate --backend cuda --fast --compute f32" "--fast.*bf16-only|built without CUDA" \
  "$bin" generate --backend cuda --fast --compute f32 --model "$model" --prompts "$work/p.jsonl" \
  --out "$work/f.jsonl" --max-new-tokens 2
no_file "generate --fast --compute f32" "$work/f.jsonl"
has_gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU && has_gpu=1
if [[ $has_gpu -eq 0 ]]; then
  for compute in bf16 f32; do
    expect_error "trace --backend cuda --compute $compute without a GPU" "no CUDA device|built without CUDA" \
      "$bin" trace --backend cuda --compute $compute --model "$model" --ids "$ids" --json "$work/c.json"
    no_file "trace --backend cuda --compute $compute without a GPU" "$work/c.json"
  done
  expect_error "generate --backend cuda without a GPU" "no CUDA device|built without CUDA" \
    "$bin" generate --backend cuda --compute bf16 --model "$model" --prompts "$work/p.jsonl" --out "$work/g.jsonl" \
    --max-new-tokens 2
  no_file "generate --backend cuda without a GPU" "$work/g.jsonl"
  echo "(no GPU: the GPU half of this test did not run)"
  finish
fi
"$bin" trace --backend cuda --compute bf16 --model "$model" --ids "$ids" --dump "$work/g.safetensors" >/dev/null \
  && ok "trace --backend cuda --compute bf16 runs" || bad "trace --backend cuda --compute bf16"
"$bin" trace --backend cpu --compute bf16 --model "$model" --ids "$ids" --dump "$work/c.safetensors" >/dev/null
"$bin" trace --backend cuda --compute f32 --model "$model" --ids "$ids" --dump "$work/g32.safetensors" >/dev/null \
  && ok "trace --backend cuda --compute f32 runs" || bad "trace --backend cuda --compute f32"
"$bin" trace --backend cpu --compute f32 --attention absorbed --model "$model" --ids "$ids" \
  --dump "$work/c32.safetensors" >/dev/null
"$bin" generate --backend cuda --compute f32 --model "$model" --prompts "$work/p.jsonl" --out "$work/g32.jsonl" \
  --max-new-tokens 4 >/dev/null && ok "generate --backend cuda --compute f32 runs" || bad "generate --compute f32"
/usr/bin/python3 "$src/tests/cuda/compare_traces.py" bf16 "$work/g.safetensors" "$work/c.safetensors" \
  && ok "cuda bf16 trace within 0.12 of cpu bf16" || bad "cuda vs cpu bf16 trace"
/usr/bin/python3 "$src/tests/cuda/compare_traces.py" f32 "$work/g32.safetensors" "$work/c32.safetensors" \
  && ok "cuda f32 trace within 1e-5 (relative L2) of cpu f32 absorbed, routes identical" || bad "cuda vs cpu f32 trace"
# Hook edits on the device (zero / scale / add, the default) and through the host
# (ATLAS_DEVICE_EDITS=0): the same dumps and the same generated tokens, byte for byte.
steering_vector "$work/v.safetensors" "$model"
edits=(--intervene 'blocks.1.hook_resid_post@2-5=add:'"$work"'/v.safetensors*2' --intervene 'blocks.0.attn.hook_out@3,7=scale:0.5'
  --intervene 'blocks.2.ln2.hook_normalized@9=zero')
for compute in bf16 f32; do
  "$bin" trace --backend cuda --compute $compute --model "$model" --ids "$ids" "${edits[@]}" \
    --dump "$work/ed_$compute.safetensors" >/dev/null
  ATLAS_DEVICE_EDITS=0 "$bin" trace --backend cuda --compute $compute --model "$model" --ids "$ids" "${edits[@]}" \
    --dump "$work/eh_$compute.safetensors" >/dev/null
  [[ -s "$work/ed_$compute.safetensors" ]] && cmp -s "$work/ed_$compute.safetensors" "$work/eh_$compute.safetensors" \
    && ok "$compute trace: device edits = host edits, byte for byte" \
    || bad "$compute trace: device edits vs host edits"
done
"$bin" generate --backend cuda --compute bf16 --model "$model" --prompts "$work/p.jsonl" --max-new-tokens 6 \
  --intervene 'blocks.1.hook_resid_post=add:'"$work"'/v.safetensors*3' --out "$work/sd.jsonl" >/dev/null
ATLAS_DEVICE_EDITS=0 "$bin" generate --backend cuda --compute bf16 --model "$model" --prompts "$work/p.jsonl" \
  --max-new-tokens 6 --intervene 'blocks.1.hook_resid_post=add:'"$work"'/v.safetensors*3' --out "$work/sh.jsonl" >/dev/null
[[ -s "$work/sd.jsonl" ]] && cmp -s "$work/sd.jsonl" "$work/sh.jsonl" \
  && ok "steered generation: device edits = host edits" || bad "steered generation: device vs host edits"
finish

#!/usr/bin/env bash
# atlas trace --intervene / --record and generate --intervene on the embedded tiny checkpoint: activation patching from a
# clean trace's dump (every token of a residual stage puts an edited input back on the clean
# path; one token moves only what follows it), expert edits, the artifact's record of the
# edits, determinism, and bad specs (one error naming the spec, exit 1, no output file).
source "$(dirname "$0")/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }

clean="1000,5,17,42,300,7,7,9,11,600,2,3"
edited="1000,5,17,42,301,7,7,9,11,600,2,3"  # token 4 edited
"$bin" trace --model "$model" --ids "$clean" --dump "$work/clean.safetensors" --json "$work/clean.json" >/dev/null \
  && ok "clean trace" || bad "clean trace"
"$bin" trace --model "$model" --ids "$edited" --json "$work/edited.json" >/dev/null && ok "edited trace" || bad "edited trace"
"$bin" trace --model "$model" --ids "$edited" --json "$work/restored.json" --dump "$work/restored.safetensors" \
  --intervene "blocks.1.hook_resid_post=patch:$work/clean.safetensors" >/dev/null && ok "patched trace" || bad "patched trace"
"$bin" trace --model "$model" --ids "$edited" --json "$work/one.json" \
  --intervene "blocks.1.hook_resid_post@4=patch:$work/clean.safetensors" >/dev/null || bad "one-token patch"
"$bin" trace --model "$model" --ids "$edited" --json "$work/experts.json" --record 'blocks.2.moe.hook_*' \
  --dump "$work/experts.safetensors" \
  --intervene 'blocks.2.moe.experts.1,6@3-11=route-out' --intervene 'blocks.3.moe.experts.0=zero' >/dev/null \
  || bad "expert edits"
"$bin" trace --model "$model" --ids "$edited" --json "$work/experts2.json" --record 'blocks.2.moe.hook_*' \
  --dump "$work/experts2.safetensors" --threads 1 \
  --intervene 'blocks.2.moe.experts.1,6@3-11=route-out' --intervene 'blocks.3.moe.experts.0=zero' >/dev/null
cmp -s "$work/experts.safetensors" "$work/experts2.safetensors" && ok "edited dumps byte-identical across runs" \
  || bad "edited dumps differ"

/usr/bin/python3 - "$work" <<'PY' && ok "patching, expert edits and their record" || bad "patching, expert edits and their record"
import hashlib, json, struct, sys
w = sys.argv[1]
load = lambda n: json.load(open(f"{w}/{n}.json"))
clean, edited, restored, one, ex = (load(n) for n in ("clean", "edited", "restored", "one", "experts"))
sha = lambda d: [s["sha256"] for s in d["stages"]]
# Stages 0-2 (embed, after layers 0 and 1) are the edited run's; from stage 2 on (the patched
# residual) every stage is the clean run's.
assert sha(restored)[:2] == sha(edited)[:2] and sha(restored)[2:] == sha(clean)[2:], (sha(restored), sha(clean))
assert restored["logits"]["sha256"] == clean["logits"]["sha256"]
# One token patched: the result differs from both runs.
assert sha(one)[-1] not in (sha(clean)[-1], sha(edited)[-1])
assert "interventions" not in clean and "interventions" not in edited
iv = restored["interventions"]
assert len(iv) == 1 and iv[0]["hook"] == "blocks.1.hook_resid_post" and iv[0]["action"] == "patch", iv
assert iv[0]["tokens"] == "all" and iv[0]["source"]["tensor"] == "hidden.2"
assert iv[0]["source"]["sha256"] == hashlib.sha256(open(f"{w}/clean.safetensors", "rb").read()).hexdigest()
# Expert edits: experts 1 and 6 of layer 2 chosen by no token in 3-11; layer 3 routes as the
# edited run's (zero keeps the choice).
g2 = {g["layer"]: g for g in ex["gates"]}
e2 = {g["layer"]: g for g in edited["gates"]}
assert g2[3]["topk_ids_sha256"] != e2[3]["topk_ids_sha256"] or g2[2]["topk_ids_sha256"] != e2[2]["topk_ids_sha256"]
raw = open(f"{w}/experts.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
meta = json.loads(h["__metadata__"]["interventions"])
assert [m["action"] for m in meta] == ["experts_route_out", "experts_zero"], meta
assert meta[0]["tokens"] == list(range(3, 12)) and meta[0]["experts"] == [1, 6]
def tensor(name):
    t = h[name]; a, b = t["data_offsets"]; body = raw[8 + n + a: 8 + n + b]
    fmt = "<%d%s" % (len(body) // 4, "i" if t["dtype"] == "I32" else "f")
    return t["shape"], struct.unpack(fmt, body)
shape, ids = tensor("blocks.2.moe.hook_topk_ids")
assert shape == [12, 3], shape
for t in range(3, 12):
    assert not {1, 6} & set(ids[3 * t: 3 * t + 3]), (t, ids[3 * t: 3 * t + 3])
_, same = tensor("router.2.topk_ids")
assert same == ids
_, logits = tensor("blocks.2.moe.hook_router_logits")
assert logits[3 * 8 + 1] == float("-inf") and logits[2 * 8 + 1] != float("-inf")
assert [r["hook"] for r in ex["recorded"]] == ["blocks.2.moe.hook_router_logits", "blocks.2.moe.hook_topk_ids",
    "blocks.2.moe.hook_topk_weights", "blocks.2.moe.hook_shared_out", "blocks.2.moe.hook_routed_out"], ex["recorded"]
PY

# generate --intervene: an expert routed out in every pass; the meta records the edits, the
# rows change, and the same command gives the same bytes.
printf '{"id": "a", "ids": [1000, 5, 17, 42]}\n{"id": "b", "ids": [1000, 300, 7, 7, 9, 11, 600]}\n' > "$work/p.jsonl"
"$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/g0.jsonl" --max-new-tokens 12 >/dev/null 2>&1 \
  || bad "generate"
for n in 1 2; do
  "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/g$n.jsonl" --max-new-tokens 12 --batch $n \
    --intervene 'blocks.1.moe.experts.0,1,2=route-out' --intervene 'blocks.2.hook_resid_post@5=zero' >/dev/null 2>&1 \
    || bad "generate --intervene (batch $n)"
done
cmp -s "$work/g1.jsonl" "$work/g2.jsonl" && ok "edited generation: the same rows at batch 1 and 2" || bad "edited rows depend on the batch"
/usr/bin/python3 - "$work" <<'PY' && ok "generate records its edits" || bad "generate records its edits"
import json, sys
w = sys.argv[1]
g0 = [json.loads(l) for l in open(f"{w}/g0.jsonl")]
g1 = [json.loads(l) for l in open(f"{w}/g1.jsonl")]
assert [r["ids"] for r in g0] != [r["ids"] for r in g1]
m0, m1 = (json.load(open(f"{w}/g{n}.jsonl.meta.json")) for n in (0, 1))
assert "interventions" not in m0
assert [e["spec"] for e in m1["interventions"]] == ["blocks.1.moe.experts.0,1,2=route-out", "blocks.2.hook_resid_post@5=zero"]
PY
# add:FILE[*F]: the clean dump's residual times -1 at token 4 gives the bytes of zeroing it
# there (x + -1 x = +0); a steering vector ([H], one for every token) in every pass of
# generation: rows the same at batch 1 and 2, recorded with its factor and file hash.
for how in "add:$work/clean.safetensors*-1" zero; do
  "$bin" trace --model "$model" --ids "$clean" --dump "$work/add_${how%%:*}.safetensors" \
    --intervene "blocks.1.hook_resid_post@4=$how" >/dev/null || bad "trace --intervene $how"
done
/usr/bin/python3 - "$work" <<'PY' && ok "add of minus the clean values = zero (dumps' tensors)" || bad "add of minus the clean values"
import json, struct, sys
w = sys.argv[1]
def tensors(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}, h
a, ha = tensors(f"{w}/add_add.safetensors")
z, _ = tensors(f"{w}/add_zero.safetensors")
assert a.keys() == z.keys() and all(a[k] == z[k] for k in a), [k for k in a if a[k] != z[k]]
meta = json.loads(ha["__metadata__"]["interventions"])
assert meta[0]["action"] == "add" and meta[0]["factor"] == -1 and meta[0]["source"]["per_position"] is True, meta
PY
steering_vector "$work/steer.safetensors" "$model"
for n in 1 2; do
  "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/s$n.jsonl" --max-new-tokens 12 --batch $n \
    --intervene "blocks.1.hook_resid_post=add:$work/steer.safetensors*4" >/dev/null 2>&1 || bad "generate steered (batch $n)"
done
cmp -s "$work/s1.jsonl" "$work/s2.jsonl" && ! cmp -s "$work/s1.jsonl" "$work/g0.jsonl" \
  && ok "steered generation: rows changed, the same at batch 1 and 2" || bad "steered generation"
/usr/bin/python3 - "$work" <<'PY' && ok "generate records the steering vector" || bad "generate records the steering vector"
import hashlib, json, sys
w = sys.argv[1]
e = json.load(open(f"{w}/s1.jsonl.meta.json"))["interventions"][0]
assert e["action"] == "add" and e["factor"] == 4 and e["tokens"] == "all", e
assert e["source"]["per_position"] is False and e["source"]["tensor"] == "blocks.1.hook_resid_post", e
assert e["source"]["sha256"] == hashlib.sha256(open(f"{w}/steer.safetensors", "rb").read()).hexdigest()
PY
expect_error "generate: add of rows without tokens" "an add of rows by position in generation names its tokens" \
  "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/bad.jsonl" --max-new-tokens 4 \
  --intervene "blocks.1.hook_resid_post=add:$work/clean.safetensors"
no_file "generate: add of rows without tokens" "$work/bad.jsonl"
expect_error "generate: logits edit" "generation cannot edit logits" \
  "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/bad.jsonl" --max-new-tokens 4 --intervene 'logits=zero'
no_file "generate: logits edit" "$work/bad.jsonl"

# Bad specs and sources: one error naming the spec (or the file and tensor), exit 1, no output.
expect_error "no action" "--intervene 'blocks.1.hook_resid_post': expected TARGET\[@TOKENS\]=ACTION" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene blocks.1.hook_resid_post
no_file "no action" "$work/bad.json"
expect_error "unknown hook" "--intervene 'blocks.1.hook_resid=zero': unknown hook" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene blocks.1.hook_resid=zero
expect_error "dense layer" "layer 0 is dense: it has no routed experts" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene blocks.0.moe.experts.3=zero
expect_error "token past the end" "--ids: --intervene 'embed@12=zero': token 12 is outside the 12 tokens" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene 'embed@12=zero'
expect_error "layer not run" "layer 3 is not run \(layers 0-1\)" \
  "$bin" trace --model "$model" --ids "$clean" --layers 0-1 --json "$work/bad.json" --intervene 'blocks.3.hook_resid_post=zero'
expect_error "patch source lacks the hook" "clean.safetensors: no tensor \"blocks.1.attn.hook_q\" to patch" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene "blocks.1.attn.hook_q=patch:$work/clean.safetensors"
expect_error "patch source missing" "none.safetensors" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --intervene "embed=patch:$work/none.safetensors"
expect_error "patch source length" "holds 12 tokens; patching every token needs exactly 3" \
  "$bin" trace --model "$model" --ids 1,2,3 --json "$work/bad.json" --intervene "blocks.1.hook_resid_post=patch:$work/clean.safetensors"
expect_error "record matches nothing" "--record 'blocks.\*.attn.hook_nothing': matches no hook" \
  "$bin" trace --model "$model" --ids "$clean" --json "$work/bad.json" --record 'blocks.*.attn.hook_nothing'
no_file "bad specs" "$work/bad.json"
finish

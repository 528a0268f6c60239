#!/usr/bin/env bash
# atlas generate on a reference fixture: greedy/seeded/CRN outputs, reproducibility, batch
# size independence, and bad input (line numbers, nothing half-written).
source "$(dirname "$0")/lib.sh"
model="$src/tests/fixtures/tiny_lite_yarn_bf16"
cat > "$work/p.jsonl" <<'J'
{"id": "a", "ids": [0, 157, 88, 295, 30, 199, 127]}
{"id": "b", "ids": [0, 82, 237]}
{"id": 3, "ids": [0, 208, 290, 304, 139, 67, 96, 174, 207, 206, 98]}

{"id": "d", "ids": [0, 2, 5, 181]}
J
g() { "$bin" generate --model "$model" --prompts "$work/p.jsonl" --max-new-tokens 8 "$@" 2>/dev/null; }
# For error checks: stderr kept, prompts given by the caller.
ge() { "$bin" generate --model "$model" --max-new-tokens 8 "$@"; }
g --out "$work/g1.jsonl" --batch 4 && ok "greedy runs" || bad "greedy runs"
g --out "$work/g2.jsonl" --batch 1
cmp -s "$work/g1.jsonl" "$work/g2.jsonl" && ok "greedy output independent of --batch" || bad "batch changes output"
/usr/bin/python3 - "$work/g1.jsonl" <<'PY' && ok "output fields" || bad "output fields"
import json, sys, hashlib, struct
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["id"] for r in rows] == ["a", "b", "3", "d"]
prompts = {"a": [0, 157, 88, 295, 30, 199, 127], "b": [0, 82, 237]}
for r in rows:
    assert set(r) == {"id", "prompt_sha256", "ids", "stop", "n_new", "rng_state_sha256"}, r.keys()  # no tokenizer: no text
    assert r["n_new"] == len(r["ids"]) and r["stop"] in ("eos", "length") and r["rng_state_sha256"] is None
    if r["id"] in prompts:
        assert r["prompt_sha256"] == hashlib.sha256(struct.pack(f"<{len(prompts[r['id']])}I", *prompts[r["id"]])).hexdigest()
PY
g --out "$work/s1.jsonl" --temperature 0.8 --top-p 0.9 --seed 5 --batch 3
g --out "$work/s2.jsonl" --temperature 0.8 --top-p 0.9 --seed 5 --batch 2
g --out "$work/s3.jsonl" --temperature 0.8 --top-p 0.9 --seed 6
cmp -s "$work/s1.jsonl" "$work/s2.jsonl" && ok "seeded reproducible across batch sizes" || bad "seeded differs"
cmp -s "$work/s1.jsonl" "$work/s3.jsonl" && bad "different seeds gave identical output" || ok "different seeds differ"
g --out "$work/c1.jsonl" --crn-tape 11 --temperature 0.7 --top-p 0.95 && ok "crn runs" || bad "crn runs"
[[ -f "$work/c1.jsonl.meta.json" ]] && ok "meta sidecar" || bad "no meta sidecar"

echo '{"id": "x", "ids": [1, 2]}' > "$work/bad.jsonl"; echo '{"id": "y", "ids": [1,' >> "$work/bad.jsonl"
expect_error "malformed line" "bad.jsonl:2" ge --prompts "$work/bad.jsonl" --out "$work/o1.jsonl"
no_file "malformed line" "$work/o1.jsonl"
echo '{"id": "x", "ids": []}' > "$work/empty.jsonl"
expect_error "empty prompt" "empty prompt" ge --prompts "$work/empty.jsonl" --out "$work/o2.jsonl"
echo '{"id": "x", "ids": [1, 99999]}' > "$work/oov.jsonl"
expect_error "id out of vocabulary" "99999 is outside the vocabulary" ge --prompts "$work/oov.jsonl" --out "$work/o3.jsonl"
no_file "id out of vocabulary" "$work/o3.jsonl"
expect_error "max-new-tokens <= 0" "max-new-tokens" "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/o4.jsonl" --max-new-tokens 0
expect_error "prompt longer than context" "context" "$bin" generate --model "$model" --prompts "$work/p.jsonl" --out "$work/o5.jsonl" --max-new-tokens 100000
expect_error "conflicting flags" "greedy" ge --prompts "$work/p.jsonl" --out "$work/o6.jsonl" --greedy --temperature 0.5 --seed 1
# Ids key the output rows (atlas compare refuses a file with two) and the sampling streams.
printf '%s\n' '{"id": 3, "ids": [1]}' '{"id": "3", "ids": [2]}' > "$work/dup.jsonl"
expect_error "duplicate id" 'dup.jsonl:2: id: duplicate id "3"' ge --prompts "$work/dup.jsonl" --out "$work/o7.jsonl"
no_file "duplicate id" "$work/o7.jsonl"
# A row's seed is checked against its type, not wrapped (-1 -> 2^64 - 1).
echo '{"id": "x", "ids": [1], "seed": -1}' > "$work/seed.jsonl"
expect_error "negative row seed" "seed.jsonl:1: seed: expected an integer from 0 to" \
  ge --prompts "$work/seed.jsonl" --out "$work/o8.jsonl" --temperature 0.5 --seed 1
no_file "negative row seed" "$work/o8.jsonl"
# The sidecar's path is checked before generating: no OUT without its OUT.meta.json.
mkdir -p "$work/o10.jsonl.meta.json"
expect_error "sidecar path a directory" "o10.jsonl.meta.json: --out: is a directory" ge --prompts "$work/p.jsonl" --out "$work/o10.jsonl"
[[ -e "$work/o10.jsonl" ]] && bad "sidecar path a directory: left o10.jsonl" || ok "sidecar path a directory: nothing left behind"
expect_error "--out into a missing directory" "--out: the directory .* does not exist" ge --prompts "$work/p.jsonl" --out "$work/none/o.jsonl"
echo '{"id": "x", "ids": [1], "seed": 1e999}' > "$work/huge.jsonl"
expect_error "number overflow" "huge.jsonl:1: malformed JSON" ge --prompts "$work/huge.jsonl" --out "$work/o9.jsonl" --temperature 0.5 --seed 1
no_file "number overflow" "$work/o9.jsonl"

# Chat messages on the tiny checkpoint (it has a tokenizer and the DeepSeek-V2 template): the
# prompt is the rendered template's ids, and rows carry decoded text.
tiny="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$tiny" >/dev/null
printf '%s\n' '[{"role": "user", "content": "Hello there, how are you?"}]' > "$work/chat.json"
printf '%s\n' '{"id": "m1", "messages": [{"role": "user", "content": "Hello there, how are you?"}]}' > "$work/chat.jsonl"
"$bin" generate --model "$tiny" --prompts "$work/chat.jsonl" --out "$work/m.jsonl" --max-new-tokens 6 \
  --crn-tape 3 --temperature 0.7 --top-p 0.9 2>/dev/null && ok "messages input" || bad "messages input"
"$bin" render --model "$tiny" --messages "$work/chat.json" --add-generation-prompt --ids > "$work/r.json"
/usr/bin/python3 - "$work/m.jsonl" "$work/r.json" <<'PY' && ok "messages prompt = rendered template ids; text present" || bad "messages prompt"
import hashlib, json, struct, sys
row = json.loads(open(sys.argv[1]).readline())
ids = json.load(open(sys.argv[2]))["ids"]
assert ids[0] == 1000 and ids.count(1000) == 1, ids            # one BOS, from the template
assert row["prompt_sha256"] == hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()
assert isinstance(row["text"], str) and row["rng_state_sha256"]
PY
finish

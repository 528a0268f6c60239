#!/usr/bin/env bash
# Bad input to the verbs without a script of their own here (run, merge, freeze, analyze, eval,
# sample-debug, render): one error naming the file or flag and the field, a non-zero exit (1,
# never the "internal error" 2 or an out-of-memory kill), nothing left behind.
source "$(dirname "$0")/lib.sh"
model="$work/tiny"
"$bin" make-model --preset tiny --seed 0 "$model" >/dev/null || { bad "make-model"; finish; }
tiny_trace_protocol bad_input "$model" "$work/p.toml"
"$bin" freeze "$work/p.toml" --out "$work/m.json" >/dev/null || { bad "freeze"; finish; }
echo x >"$work/file"

# Flag parsing (CLI11's errors): one line naming the verb, exit 1 like any other bad input.
flag_error() {
  local name="$1" pattern="$2"; shift 2
  local err rc
  err="$("$@" 2>&1 >/dev/null)"; rc=$?
  if [[ $rc -ne 1 || $(wc -l <<<"$err") -ne 1 ]] || ! grep -qE -- "$pattern" <<<"$err"; then
    bad "$name: exit $rc, '$err' (want exit 1 and one line matching /$pattern/)"
  else ok "$name ($err)"; fi
}
flag_error "bench: a word for --repeat" "^atlas bench: error: --repeat: .*abc" "$bin" bench --model "$model" --repeat abc
flag_error "trace: an unknown flag" "^atlas trace: error: .*--bogus" "$bin" trace --model "$model" --ids 1 --bogus
flag_error "an unknown verb" '^atlas: error: unknown verb "tracee"' "$bin" tracee --model "$model"
flag_error "no verb" "^atlas: error: .*subcommand is required" "$bin"
flag_error "an option and no verb" '^atlas: error: unknown option "--bogus" before the verb' "$bin" --bogus
"$bin" trace --help >/dev/null || bad "trace --help exited non-zero"

# run: a --backend that does not load leaves no empty journal/ or hidden/ behind; an --out that
# is a file and a negative --threads are one error each.
expect_error "run: unknown backend" '--backend: unknown value "tpu"' "$bin" run "$work/m.json" --out "$work/r1" --backend tpu
no_file "run: unknown backend" "$work/r1"
expect_error "run: --out is a file" "file: --out: exists and is not a directory" "$bin" run "$work/m.json" --out "$work/file"
expect_error "run: negative --threads" "--threads: .*got -2" "$bin" run "$work/m.json" --out "$work/r2" --threads -2
no_file "run: negative --threads" "$work/r2"
echo '{"kind": 5}' >"$work/kind.json"
expect_error "run: manifest kind not a string" "kind.json: kind: not an atlas probe manifest" "$bin" run "$work/kind.json" --out "$work/r3"

# merge: a shard's run.json that is not an object, or whose kind is not a string.
mkdir -p "$work/s_arr" "$work/s_kind"
echo '[]' >"$work/s_arr/run.json"
echo '{"kind": 5}' >"$work/s_kind/run.json"
expect_error "merge: run.json an array" "s_arr/run.json: kind: not an atlas probe run" "$bin" merge "$work/m.json" "$work/s_arr" --out "$work/mg1"
no_file "merge: run.json an array" "$work/mg1"
expect_error "merge: kind a number" "s_kind/run.json: kind: not an atlas probe run" "$bin" merge "$work/m.json" "$work/s_kind" --out "$work/mg2"
no_file "merge: kind a number" "$work/mg2"

# freeze: --per-domain 0 is refused like -1 (not read as "not given"); a filler_repeat no
# context can hold names the field (not "out of memory").
expect_error "freeze: --per-domain 0" "--per-domain: must be positive" "$bin" freeze "$work/p.toml" --out "$work/m0.json" --per-domain 0
no_file "freeze: --per-domain 0" "$work/m0.json"
sed 's/filler_repeat = 3/filler_repeat = 99999999999/' "$work/p.toml" >"$work/huge.toml"
expect_error "freeze: huge filler_repeat" "huge.toml: blocks.filler_repeat: expected a positive integer .at most" \
  "$bin" freeze "$work/huge.toml" --out "$work/m1.json"
no_file "freeze: huge filler_repeat" "$work/m1.json"

# analyze: a negative count is checked against its type, not wrapped to 2^32 - 4.
printf '%s\n' '{"format": "atlas-analysis-input-v1", "experts": -4, "top_k": 2, "layers": [1], "conditions": ["a"],' \
  ' "sources": [{"id": "s", "domain": "d"}], "cells": []}' >"$work/neg.json"
expect_error "analyze: negative experts" "neg.json: experts: expected an integer from 0 to 4294967295, got -4" \
  "$bin" analyze "$work/neg.json" --out "$work/a1"
no_file "analyze: negative experts" "$work/a1"
"$bin" run "$work/m.json" --out "$work/run" >/dev/null 2>&1 || bad "run"
expect_error "analyze: --out is a file" "file: .*Not a directory" "$bin" analyze "$work/run" --out "$work/file" --replicates 0

# eval (and humaneval): a negative --workers, a zero limit.
expect_error "eval: negative --workers" "--workers: must be >= 0" \
  "$bin" eval "$work/none.json" --manifest "$work/m.json" --out "$work/E.json" --workers -1
no_file "eval: negative --workers" "$work/E.json"
expect_error "humaneval: zero --memory-mib" "--memory-mib: must be from 1 to" \
  "$bin" humaneval --problems "$work/none.jsonl" --samples "$work/none.jsonl" --out "$work/H.jsonl" --memory-mib 0
no_file "humaneval: zero --memory-mib" "$work/H.jsonl"

# gsm8k and humaneval: an empty samples file is an error (a 0/0 score is no result).
: >"$work/empty.jsonl"
echo '{"question": "2+2?", "answer": "so #### 4"}' >"$work/gsm.jsonl"
expect_error "gsm8k: no samples" "empty.jsonl: no samples" \
  "$bin" gsm8k --problems "$work/gsm.jsonl" --samples "$work/empty.jsonl" --out "$work/G.jsonl"
no_file "gsm8k: no samples" "$work/G.jsonl"
echo '{"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}' >"$work/he.jsonl"
expect_error "humaneval: no samples" "empty.jsonl: no samples" \
  "$bin" humaneval --problems "$work/he.jsonl" --samples "$work/empty.jsonl" --out "$work/H.jsonl"
no_file "humaneval: no samples" "$work/H.jsonl"

# sample-debug: a number past double's range is malformed JSON of that file; --steps is bounded.
echo '[1, 1e999]' >"$work/logits_big.json"
expect_error "sample-debug: 1e999" "logits_big.json: malformed JSON" "$bin" sample-debug --logits "$work/logits_big.json" --seed 1
echo '[1, 2, 3]' >"$work/logits.json"
expect_error "sample-debug: huge --steps" "--steps: must be from 1 to" \
  "$bin" sample-debug --logits "$work/logits.json" --seed 1 --steps 99999999999 --out "$work/sd.json"
no_file "sample-debug: huge --steps" "$work/sd.json"
expect_error "sample-debug: --step overflow" "--step: " \
  "$bin" sample-debug --logits "$work/logits.json" --seed 1 --step 18446744073709551615 --steps 2

# render: a template's string repetition is bounded like range().
echo '[{"role": "user", "content": "hi"}]' >"$work/msgs.json"
echo '{{ "a" * 99999999999 }}' >"$work/rep.jinja"
expect_error "render: huge repetition" "rep.jinja: line 1, column [0-9]+: repetition too big" \
  "$bin" render --messages "$work/msgs.json" --template "$work/rep.jinja"
finish

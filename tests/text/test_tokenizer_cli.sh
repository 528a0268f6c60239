#!/usr/bin/env bash
# atlas tokenize / detokenize: output format, batch input, and one clear error (non-zero exit, no
# partial output) for each kind of bad input.
set -u
bin="${ATLAS_BIN:?}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

# A character-level BPE: a=0 b=1 c=2 ab=3, merge "a b", special <s>=9, decoder joins tokens.
m="$tmp/model"
mkdir -p "$m"
cat >"$m/tokenizer.json" <<'JSON'
{"added_tokens": [{"id": 9, "content": "<s>", "special": true, "normalized": false}],
 "normalizer": null,
 "pre_tokenizer": {"type": "WhitespaceSplit"},
 "post_processor": null,
 "decoder": {"type": "Fuse"},
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3}, "merges": ["a b"]}}
JSON
echo '{"bos_token": "<s>", "add_bos_token": true}' >"$m/tokenizer_config.json"

# Expected outputs follow from the vocabulary above by hand.
out=$("$bin" tokenize --model "$m" --text "abc a")
[[ "$out" == '{"ids": [3, 2, 0], "offsets": [[0, 2], [2, 3], [4, 5]]}' ]] || fail "tokenize --text: $out"
out=$("$bin" tokenize --model "$m" --text "ab" --special)
[[ "$out" == '{"ids": [9, 3], "offsets": [[0, 0], [0, 2]]}' ]] || fail "tokenize --special: $out"
out=$("$bin" tokenize --model "$m" --text "c<s>c")
[[ "$out" == '{"ids": [2, 9, 2], "offsets": [[0, 1], [1, 4], [4, 5]]}' ]] || fail "special token in text: $out"
out=$("$bin" tokenize --model "$m" --text "")
[[ "$out" == '{"ids": [], "offsets": []}' ]] || fail "empty text: $out"

printf '{"q": "ab"}\n\n{"q": "ba", "other": 1}\n' >"$tmp/in.jsonl"
out=$("$bin" tokenize --model "$m" --input "$tmp/in.jsonl" --field q)
[[ "$out" == $'{"ids": [3], "offsets": [[0, 2]]}\n{"ids": [1, 0], "offsets": [[0, 1], [1, 2]]}' ]] || fail "tokenize --input: $out"

out=$("$bin" detokenize --model "$m" --ids 9,3,2)
[[ "$out" == "<s>abc" ]] || fail "detokenize: $out"
out=$("$bin" detokenize --model "$m" --ids "9, 3" --skip-special)
[[ "$out" == "ab" ]] || fail "detokenize --skip-special: $out"

"$bin" tokenize --help >/dev/null || fail "tokenize --help"
"$bin" detokenize --help >/dev/null || fail "detokenize --help"

# expect_error NAME PATTERN CMD...: non-zero exit, nothing on stdout, stderr matches PATTERN.
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if ((rc == 0)); then fail "$name: exit 0"; return; fi
  if [[ -s "$tmp/out" ]]; then fail "$name: partial output: $(head -c 200 "$tmp/out")"; fi
  grep -qE -- "$pattern" "$tmp/err" || fail "$name: stderr does not match '$pattern': $(cat "$tmp/err")"
}

expect_error "no text" "--text" "$bin" tokenize --model "$m"
expect_error "invalid UTF-8 text" "UTF-8" "$bin" tokenize --model "$m" --text $'ab\xff'
printf '{"text": "ab"}\n{"text": "a\xc3("}\n' >"$tmp/bad.jsonl"
expect_error "invalid UTF-8 line" "bad.jsonl:2" "$bin" tokenize --model "$m" --input "$tmp/bad.jsonl"
printf '{"text": "ab"}\n{"txt": "ab"}\n' >"$tmp/nofield.jsonl"
expect_error "missing field" "nofield.jsonl:2: text" "$bin" tokenize --model "$m" --input "$tmp/nofield.jsonl"
printf '{"text": "ab"}\n{"text": \n' >"$tmp/badjson.jsonl"
expect_error "malformed jsonl" "badjson.jsonl:2" "$bin" tokenize --model "$m" --input "$tmp/badjson.jsonl"
expect_error "missing input" "nope.jsonl" "$bin" tokenize --model "$m" --input "$tmp/nope.jsonl"
expect_error "missing model dir" "tokenizer.json" "$bin" tokenize --model "$tmp/none" --text a

b="$tmp/bad-model"
mkdir -p "$b"
echo '{"added_tokens": []}' >"$b/tokenizer.json"
expect_error "no model" "tokenizer.json: model" "$bin" tokenize --model "$b" --text a
echo '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Magic"}}' >"$b/tokenizer.json"
expect_error "unknown pre-tokenizer" "pre_tokenizer.type.*Magic" "$bin" tokenize --model "$b" --text a
echo '{"model": {"type": "WordPiece", "vocab": {"a": 0}}}' >"$b/tokenizer.json"
expect_error "unknown model type" "model.type.*WordPiece" "$bin" tokenize --model "$b" --text a
echo '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []' >"$b/tokenizer.json"
expect_error "truncated tokenizer.json" "tokenizer.json" "$bin" tokenize --model "$b" --text a
cp "$m/tokenizer.json" "$b/tokenizer.json"
echo '{"eos_token": {"content": "</nope>"}}' >"$b/tokenizer_config.json"
expect_error "unknown special token" "tokenizer_config.json: eos_token.*</nope>" "$bin" tokenize --model "$b" --text a
echo '{"bos_token": 5}' >"$b/tokenizer_config.json"
expect_error "bad token type" "tokenizer_config.json: bos_token" "$bin" tokenize --model "$b" --text a

expect_error "unknown id" "4000" "$bin" detokenize --model "$m" --ids 1,4000
expect_error "bad id" "--ids" "$bin" detokenize --model "$m" --ids 1,x
expect_error "empty id" "--ids" "$bin" detokenize --model "$m" --ids 1,,2

exit $fails

#!/usr/bin/env bash
# One chat-template loader: `atlas render --ids` and `atlas generate` (a {"messages"} prompt)
# must turn the same messages into the same prompt ids, for
#   * the tiny checkpoint's own template (tokenizer_config.json, DeepSeek-V2 style);
#   * the real DeepSeek-V2-Lite template (../shared/data; skipped visibly when absent);
#   * a chat_template.jinja next to the config (transformers prefers it) that uses the special
#     tokens beyond BOS/EOS (pad/unk), which generate did not pass to templates before.
# `atlas probe freeze` goes through the same loader; tests/probe/test_probe_cli.py checks its
# official ids against `atlas render`.
set -u
bin="${ATLAS_BIN:?}"
src="${ATLAS_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
skipped=0

"$bin" make-model --preset tiny --seed 0 "$tmp/m" >/dev/null 2>&1 || { echo "FAILED: make-model"; exit 1; }
[[ -f "$tmp/m/tokenizer.json" && -f "$tmp/m/tokenizer_config.json" ]] || { echo "FAILED: tiny model has no tokenizer files"; exit 1; }

cat > "$tmp/msgs.json" <<'J'
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there, ünïcode 中文"},
 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
J

# same_prompt DIR LABEL: render --ids and generate's prompt_sha256 agree on the messages.
same_prompt() {
  local dir="$1" label="$2"
  local ids
  ids=$("$bin" render --model "$dir" --messages "$tmp/msgs.json" --add-generation-prompt --ids 2>"$tmp/err") \
    || { echo "FAILED [$label]: render: $(cat "$tmp/err")"; fails=$((fails+1)); return; }
  /usr/bin/python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(json.dumps({"id": "x", "messages": m}))' \
    "$tmp/msgs.json" > "$tmp/p.jsonl"
  "$bin" generate --model "$dir" --prompts "$tmp/p.jsonl" --out "$tmp/g.jsonl" --max-new-tokens 1 2>"$tmp/err" \
    || { echo "FAILED [$label]: generate: $(cat "$tmp/err")"; fails=$((fails+1)); return; }
  /usr/bin/python3 - "$ids" "$tmp/g.jsonl" "$label" <<'PY' || fails=$((fails+1))
import hashlib, json, struct, sys
ids = json.loads(sys.argv[1])["ids"]
row = json.loads(open(sys.argv[2]).readline())
want = hashlib.sha256(struct.pack("<%dI" % len(ids), *ids)).hexdigest()
if row["prompt_sha256"] != want:
    print("FAILED [%s]: generate's prompt differs from render --ids (%d ids)" % (sys.argv[3], len(ids)))
    sys.exit(1)
print("ok [%s]: %d prompt ids identical" % (sys.argv[3], len(ids)))
PY
}

same_prompt "$tmp/m" "tiny model template"

# ../shared/data: the first shared/data above the source tree (ATLAS_DATA_DIR overrides).
data="${ATLAS_DATA_DIR:-}"
if [[ -z "$data" ]]; then
  d=$(cd "$src" && pwd)
  while [[ "$d" != "/" && ! -d "$d/shared/data" ]]; do d=$(dirname "$d"); done
  [[ -d "$d/shared/data" ]] && data="$d/shared/data"
fi
real="$data/deepseek-v2-lite/tokenizer_config.json"
if [[ -n "$data" && -f "$real" ]]; then
  mkdir "$tmp/dsv2" && cp "$tmp/m"/* "$tmp/dsv2/"
  # The real config (template and special tokens), on the tiny model's tokenizer (same special tokens).
  cp "$real" "$tmp/dsv2/tokenizer_config.json"
  same_prompt "$tmp/dsv2" "DeepSeek-V2-Lite template"
else
  echo "SKIP [DeepSeek-V2-Lite template]: ../shared/data/deepseek-v2-lite/tokenizer_config.json not found"
  skipped=1
fi

mkdir "$tmp/jinja" && cp "$tmp/m"/* "$tmp/jinja/"
/usr/bin/python3 - "$tmp/jinja/tokenizer_config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["pad_token"] = c.get("eos_token")  # a special token beyond BOS/EOS for the template to use
json.dump(c, open(p, "w"), ensure_ascii=False)
PY
printf '%s' '{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ pad_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}' \
  > "$tmp/jinja/chat_template.jinja"
same_prompt "$tmp/jinja" "chat_template.jinja with pad_token"
# The .jinja file wins over the config's template, as in transformers.
out=$("$bin" render --model "$tmp/jinja" --messages "$tmp/msgs.json")
[[ "$out" == *"[system]Be brief."* ]] || { echo "FAILED: chat_template.jinja not preferred: [$out]"; fails=$((fails+1)); }

if [[ $fails -eq 0 && $skipped -eq 1 ]]; then exit 77; fi
exit $fails

#!/usr/bin/env bash
# atlas render: bad input fails with one clear error naming the file/field, non-zero exit and no
# output; good input renders the template's text exactly (no newline added).
set -u
bin="${ATLAS_BIN:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
mkdir "$tmp/model"
printf '%s' '{"bos_token": {"content": "<B>"}, "eos_token": "<E>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"}' \
  > "$tmp/model/tokenizer_config.json"
printf '%s' '[{"role": "user", "content": "hi"}]' > "$tmp/chat.json"

# expect_error NEEDLE CMD...: non-zero exit, empty stdout, NEEDLE in stderr
expect_error() {
  local needle="$1"; shift
  local out err rc
  out=$("$@" 2>"$tmp/err"); rc=$?; err=$(cat "$tmp/err")
  if [[ $rc -eq 0 || -n "$out" || "$err" != *"$needle"* ]]; then
    echo "FAILED: $* -> rc=$rc out=[$out] err=[$err] (wanted error containing [$needle])"; fails=$((fails+1))
  fi
}
expect_output() {
  local want="$1"; shift
  local out; out=$("$@"; printf x); out="${out%x}"
  if [[ "$out" != "$want" ]]; then echo "FAILED: $* -> [$out], wanted [$want]"; fails=$((fails+1)); fi
}

expect_output "<B>user:hi<E>" "$bin" render --model "$tmp/model" --messages "$tmp/chat.json"
expect_output "<B>user:hi<E>A:" "$bin" render --model "$tmp/model" --messages "$tmp/chat.json" --add-generation-prompt
printf '%s' '{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": true}' > "$tmp/obj.json"
expect_output "<B>user:x<E>A:" "$bin" render --model "$tmp/model" --messages "$tmp/obj.json"
"$bin" render --help >/dev/null || { echo "FAILED: render --help"; fails=$((fails+1)); }

expect_error "$tmp/missing.json" "$bin" render --model "$tmp/model" --messages "$tmp/missing.json"
printf '%s' '[{"role": ' > "$tmp/trunc.json"
expect_error "$tmp/trunc.json: malformed JSON" "$bin" render --model "$tmp/model" --messages "$tmp/trunc.json"
printf '%s' '[{"role": "user"}, 5]' > "$tmp/elem.json"
expect_error "$tmp/elem.json: messages[1]" "$bin" render --model "$tmp/model" --messages "$tmp/elem.json"
printf '%s' '{"role": "user"}' > "$tmp/notlist.json"
expect_error "$tmp/notlist.json: messages" "$bin" render --model "$tmp/model" --messages "$tmp/notlist.json"
expect_error "tokenizer_config.json" "$bin" render --model "$tmp/nowhere" --messages "$tmp/chat.json"
mkdir "$tmp/notemplate"; printf '%s' '{"bos_token": "<B>"}' > "$tmp/notemplate/tokenizer_config.json"
expect_error "chat_template: missing" "$bin" render --model "$tmp/notemplate" --messages "$tmp/chat.json"
mkdir "$tmp/badsyntax"
printf '%s' '{"chat_template": "ok\n{% for m in messages %}{{ m.role }"}' > "$tmp/badsyntax/tokenizer_config.json"
expect_error "chat_template: line 2" "$bin" render --model "$tmp/badsyntax" --messages "$tmp/chat.json"
mkdir "$tmp/raises"
printf '%s' '{"chat_template": "{{ raise_exception(\"Only user roles, got \" ~ messages[0].role) }}"}' > "$tmp/raises/tokenizer_config.json"
expect_error "Only user roles, got user" "$bin" render --model "$tmp/raises" --messages "$tmp/chat.json"
mkdir "$tmp/named"
printf '%s' '{"chat_template": [{"name": "tool_use", "template": "T"}]}' > "$tmp/named/tokenizer_config.json"
expect_error "no template named 'default'" "$bin" render --model "$tmp/named" --messages "$tmp/chat.json"
expect_output "T" "$bin" render --model "$tmp/named" --messages "$tmp/chat.json" --template-name tool_use
printf '%s' '{"bos_token": 7, "chat_template": "x"}' > "$tmp/model2.json"; mkdir "$tmp/badtok"; cp "$tmp/model2.json" "$tmp/badtok/tokenizer_config.json"
expect_error "bos_token" "$bin" render --model "$tmp/badtok" --messages "$tmp/chat.json"
expect_error "--vars" "$bin" render --model "$tmp/model" --messages "$tmp/chat.json" --vars '[1]'
# A message without a field the template needs: the template's error, naming the messages file.
mkdir "$tmp/concat"
printf '%s' '{"chat_template": "{% for m in messages %}{{ m.role + \":\" + m.content }}{% endfor %}"}' > "$tmp/concat/tokenizer_config.json"
printf '%s' '[{"role": "user"}]' > "$tmp/nocontent.json"
expect_error "$tmp/nocontent.json: the chat template failed on these messages: " \
  "$bin" render --model "$tmp/concat" --messages "$tmp/nocontent.json"
expect_error "has no attribute 'content'" "$bin" render --model "$tmp/concat" --messages "$tmp/nocontent.json"
exit $fails

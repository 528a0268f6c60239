# Shared helpers for CLI script tests (sourced). Each test gets a fresh temp dir.
set -u
bin="${ATLAS_BIN:?ATLAS_BIN must point at build/atlas}"
src="${ATLAS_SOURCE_DIR:?}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fails=0
ok()   { echo "ok   $*"; }
bad()  { echo "FAIL $*"; fails=$((fails + 1)); }
# expect_error NAME PATTERN CMD...: CMD must exit non-zero with one stderr line matching PATTERN.
expect_error() {
  local name="$1" pattern="$2"; shift 2
  local err rc
  err="$("$@" 2>&1 >/dev/null)"; rc=$?
  if [[ $rc -eq 0 ]]; then bad "$name: exited 0"; return; fi
  if ! grep -qE -- "$pattern" <<<"$err"; then bad "$name: error '$err' does not match /$pattern/"; return; fi
  ok "$name ($err)"
}
# no_file NAME PATH: PATH (and any temp sibling) must not exist.
no_file() {
  if compgen -G "$2*" >/dev/null; then bad "$1: left $(compgen -G "$2*" | head -1)"; else ok "$1: nothing left behind"; fi
}
finish() { echo "$fails failed"; exit $((fails > 0)); }

# steering_vector OUT.safetensors MODEL_DIR: one F32 [hidden_size] tensor named
# blocks.1.hook_resid_post (values ((i % 5) - 2) * 0.75), an add:FILE source for the tests.
steering_vector() {
  /usr/bin/python3 - "$1" "$2/config.json" <<'PY'
import json, struct, sys
H = json.load(open(sys.argv[2]))["hidden_size"]
body = struct.pack("<%df" % H, *[((i % 5) - 2) * 0.75 for i in range(H)])
head = json.dumps({"blocks.1.hook_resid_post": {"dtype": "F32", "shape": [H], "data_offsets": [0, len(body)]}}).encode()
head += b" " * (-len(head) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(head)) + head + body)
PY
}

# tiny_trace_protocol NAME MODEL_DIR OUT.toml: the small trace-mode probe protocol that several
# script tests run on the tiny checkpoint (2 domains x 3 inline texts, 2 sources per domain,
# one group of 3 conditions: a baseline and two single-ID edits, hidden vectors recorded).
tiny_trace_protocol() {
  cat > "$3" <<TOML
[protocol]
name = "$1"

[model]
dir = "$2"

[[corpus]]
domain = "english"
format = "inline"
texts = ["The quick brown fox jumps over the lazy dog.", "Routing probes change one token.", "Experts receive tokens."]

[[corpus]]
domain = "code"
format = "inline"
texts = ["def add(a, b):\\n    return a + b\\n", "print(1 + 2)\\n", "x = [i * i for i in range(4)]\\n"]

[selection]
salt = "$1"
per_domain = 2

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 3

[[condition]]
name = "s0_eos"
history = "filler"
group = "s0"

[[condition]]
name = "s0_post"
history = "filler"
group = "s0"
edits = [{ anchor = "gen_role_head", to = "x" }]

[[condition]]
name = "s0_period"
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "." }]

[execution]
mode = "trace"
layers = ""
record_hidden_vectors = true

[batching]
sources_per_batch = 2
TOML
}

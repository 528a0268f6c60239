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

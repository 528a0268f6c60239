#!/usr/bin/env bash
# The CLI answers --help and --version, and rejects unknown verbs and flags with a non-zero exit.
set -u
bin="${ATLAS_BIN:?}"
fails=0
expect() { if ! "$@" >/dev/null 2>&1; then echo "FAILED: $*"; fails=$((fails+1)); fi; }
expect_fail() { if "$@" >/dev/null 2>&1; then echo "UNEXPECTED SUCCESS: $*"; fails=$((fails+1)); fi; }
expect "$bin" --help
expect "$bin" --version
expect "$bin" version --json
expect_fail "$bin"
expect_fail "$bin" no-such-verb
expect_fail "$bin" version --no-such-flag
exit $fails

#!/usr/bin/env bash
# inspect on the real DeepSeek-V2-Lite directory (config + index, no weights): the accounting
# of issue 2 (5,291 tensors, 31,412,968,448 bytes). Skips (77) when shared data is absent.
set -u
bin="${ATLAS_BIN:?}"
dir="${ATLAS_SOURCE_DIR:?}/../shared/data/deepseek-v2-lite"
if [[ ! -f "$dir/model.safetensors.index.json" ]]; then echo "skip: $dir absent"; exit 77; fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$bin" inspect "$dir" --json >"$out" || { echo "FAILED: inspect exited non-zero"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))["verification"]
assert v["ok"], v["problems"]
assert v["layout"] == "index-only" and not v["weights_present"], v
assert v["total_tensors"] == 5291 and v["expected_tensors"] == 5291, v
assert v["total_bytes"] == 31412968448 and v["index_total_size"] == 31412968448, v
assert v["index_total_matches"] is True and v["unexpected"] == [], v
assert v["by_dtype"]["BF16"]["params"] * 2 == 31412968448
print("1 passed, 0 failed")
PY

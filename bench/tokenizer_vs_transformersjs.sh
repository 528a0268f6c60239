#!/usr/bin/env bash
# Tokenizer encode throughput: atlas (bench/bench_tokenizer.cpp) next to transformers.js
# (@lenml/tokenizers, tools/oracle-js/oracle.mjs bench) on the same text, in the same run, single
# thread, for DeepSeek-V3, Qwen3 and Llama-3. Prints MB/s for both and the ratio.
#
#   bench/tokenizer_vs_transformersjs.sh [BUILD_DIR] [SECONDS]
# Needs: a release build (atlas_bench), tools/oracle-js/node_modules (tools/dev deps), and
# shared/data/wikitext2/wiki.valid.raw above the repository (or ATLAS_DATA_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
secs="${2:-3}"
data="${ATLAS_DATA_DIR:-}"
if [[ -z "$data" ]]; then
  d="$root"
  while [[ "$d" != "/" ]]; do
    [[ -f "$d/shared/data/wikitext2/wiki.valid.raw" ]] && { data="$d/shared/data"; break; }
    d="$(dirname "$d")"
  done
fi
text="$data/wikitext2/wiki.valid.raw"
[[ -f "$text" ]] || { echo "no wikitext2/wiki.valid.raw found (set ATLAS_DATA_DIR)" >&2; exit 77; }
[[ -d "$root/tools/oracle-js/node_modules/@lenml/tokenizers" ]] || { echo "run tools/dev deps first" >&2; exit 77; }
[[ -x "$build/atlas_bench" ]] || { echo "no $build/atlas_bench (build the release preset)" >&2; exit 1; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); node $(node --version)"
echo "text: $text ($(wc -c <"$text") bytes, non-empty lines encoded one by one, no special tokens)"
printf '%-12s %12s %16s %8s\n' tokenizer "atlas MB/s" "transformers.js" ratio
for name in deepseek_v3 qwen3 llama3; do
  ours=$(ATLAS_DATA_DIR="$data" "$build/atlas_bench" --benchmark_filter="BM_TokenizerEncode/$name/" \
           --benchmark_min_time="$secs" --benchmark_format=json 2>/dev/null |
         python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; print("%.2f" % (b["bytes_per_second"]/1e6))')
  js=$(cd "$root/tools/oracle-js" && node oracle.mjs bench "$name" "$text" "$secs" |
       python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["mb_per_s"])')
  ratio=$(python3 -c "print('%.1fx' % ($ours / $js))")
  printf '%-12s %12s %16s %8s\n' "$name" "$ours" "$js" "$ratio"
done

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
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "MB/s of input text per wall-clock second, and per CPU second (in parentheses)"
printf '%-12s %20s %20s %16s\n' tokenizer "atlas" "transformers.js" "ratio wall (cpu)"
for name in deepseek_v3 qwen3 llama3; do
  read -r ours ours_cpu < <(ATLAS_DATA_DIR="$data" "$build/atlas_bench" --benchmark_filter="BM_TokenizerEncode/$name/" \
           --benchmark_min_time="$secs" --benchmark_format=json 2>/dev/null |
         python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; r=b["bytes_per_second"]/1e6; print("%.2f %.2f" % (r, r*b["real_time"]/b["cpu_time"]))')
  read -r js js_cpu < <(cd "$root/tools/oracle-js" && node oracle.mjs bench "$name" "$text" "$secs" |
       python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f %.2f" % (j["mb_per_s"], j["mb_per_cpu_s"]))')
  ratio=$(python3 -c "print('%.1fx (%.1fx)' % ($ours / $js, $ours_cpu / $js_cpu))")
  printf '%-12s %20s %20s %16s\n' "$name" "$ours ($ours_cpu)" "$js ($js_cpu)" "$ratio"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Full atlas build + CUDA tests on a GPU machine that lacks some Debian dev packages (the H200
# machine: Ubuntu 24.04 without oniguruma, utf8proc, libzip dev files). Not a CTest script.
#   tests/cuda/gpu_full_run.sh DEBS_DIR [bench]
# DEBS_DIR holds .deb files fetched elsewhere with `apt-get download` (Debian 12: libonig-dev
# libonig5 libutf8proc-dev libutf8proc2 libzip-dev libzip4 libcli11-dev nlohmann-json3-dev
# libssl-dev libssl3 zlib1g-dev libtomlplusplus-dev libtomlplusplus3). Each -dev package whose header the system lacks is unpacked
# with `dpkg -x` (with its runtime library) into a private prefix, never into /, and its .pc
# files are rewritten to that prefix; CMake finds it through CMAKE_PREFIX_PATH/PKG_CONFIG_PATH.
# With "bench": also makes a full-size random DeepSeek-V2-Lite and runs atlas_cuda_model_bench.
# Logs go to $OUT (the device tool's folder) or ./gpu-out.
set -uo pipefail
debs=$(realpath "$1")
mode=${2:-}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
prefix=$PWD/.gpu-prefix
rm -rf "$prefix"
mkdir -p "$prefix"
{
  echo "== probe"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -1; cmake --version | head -1; nproc; head -2 /etc/os-release; gcc --version | head -1
} 2>&1 | tee "$out/probe.log"

# -dev package -> a header that proves the system has it; runtime package -> its library.
unpack() {  # unpack PKG_GLOB
  for f in "$debs"/$1_*.deb; do echo "   unpack $(basename "$f")"; dpkg -x "$f" "$prefix"; done
}
need() {  # need HEADER DEV_PKG [RUNTIME_PKG]
  if [[ -e /usr/include/$1 ]]; then echo "   system has $1"; return; fi
  unpack "$2"
  # Always with its runtime package: the -dev .so symlink is relative and must not dangle.
  if [[ -n "${3:-}" ]]; then unpack "$3"; fi
}
{
  echo "== dependencies"
  need oniguruma.h libonig-dev libonig5
  need utf8proc.h libutf8proc-dev libutf8proc2
  need zip.h libzip-dev libzip4
  need openssl/ssl.h libssl-dev libssl3
  need zlib.h zlib1g-dev
  need CLI/CLI.hpp libcli11-dev
  need nlohmann/json.hpp nlohmann-json3-dev
  need toml++/toml.h libtomlplusplus-dev libtomlplusplus3
  # Debian's .pc files name /usr: point them at the prefix.
  find "$prefix" -name '*.pc' -exec sed -i -E "s#(=|-I|-L)/usr#\1$prefix/usr#g" {} +
  find "$prefix" -name '*.pc' | head -20
} 2>&1 | tee "$out/deps.log"

export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=${BUILD_DIR:-build-gpu-full}  # outside the carried tree, a warm machine keeps it between runs
start=$(date +%s)
{
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix/usr" &&
    cmake --build "$B" -j"$(nproc)" --target atlas atlas_cuda_tests atlas_cuda_model_tests \
      $([[ $mode == bench ]] && echo atlas_cuda_model_bench)
} >"$out/build.log" 2>&1
brc=$?
echo "== build rc=$brc in $(( $(date +%s) - start )) s"
grep -E "error|CMake Error|not found" "$out/build.log" | head -30
[[ $brc -ne 0 ]] && { tail -40 "$out/build.log"; exit 1; }


rc=0
echo "== atlas_cuda_tests"
$B/tests/cuda/atlas_cuda_tests >"$out/cuda_tests.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|seed" "$out/cuda_tests.log" | head -30
echo "== atlas_cuda_model_tests"
$B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|rel |agreement|Expected|Which is|which is" "$out/model_tests.log" | head -80
echo "== second run of the model tests (determinism across processes)"
$B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests-2.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED) " "$out/model_tests-2.log"
cmp <(grep " rel " "$out/model_tests.log") <(grep " rel " "$out/model_tests-2.log") && echo "   stage errors identical across the two processes"

echo "== CLI"
tiny=/tmp/atlas-tiny
rm -rf $tiny
$B/atlas make-model --preset tiny --seed 0 $tiny >/dev/null
$B/atlas trace --backend cuda --compute bf16 --model $tiny --ids 1,2,3,4,5 --json "$out/trace_cuda.json" 2>&1 | tail -3 || rc=1
$B/atlas trace --backend cuda --model $tiny --ids 1,2,3 2>&1 | tail -1  # f32: expect the clear error
# Generation on a fixture without a tokenizer (ids in, ids out), both backends, greedy.
fx=tests/fixtures/tiny_lite_yarn_bf16
printf '{"id":"a","ids":[1,2,3]}\n{"id":"b","ids":[9,8,7,6,5,4]}\n{"id":"c","ids":[100,200,300,17]}\n' >/tmp/prompts.jsonl
$B/atlas generate --backend cuda --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/gen_cuda.jsonl" \
  --max-new-tokens 12 2>&1 | tail -2 || rc=1
$B/atlas generate --backend cpu --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/gen_cpu.jsonl" \
  --max-new-tokens 12 2>&1 | tail -2
/usr/bin/python3 -c 'import json,sys; [print(sys.argv[i][-14:], json.loads(l)["id"], json.loads(l).get("ids")) for i in (1,2) for l in open(sys.argv[i])]' \
  "$out/gen_cuda.jsonl" "$out/gen_cpu.jsonl"
echo "== tests/cuda/test_cuda_cli.sh"
ATLAS_BIN=$B/atlas ATLAS_SOURCE_DIR=$PWD bash tests/cuda/test_cuda_cli.sh 2>&1 | tail -8 || rc=1

if [[ $mode == bench && $rc -eq 0 ]]; then
  echo "== full-size random DeepSeek-V2-Lite"
  t0=$(date +%s)
  timeout 170 $B/atlas make-model --preset lite --seed 0 /tmp/lite >"$out/make_lite.log" 2>&1
  echo "   make-model rc=$? in $(( $(date +%s) - t0 )) s; $(du -sh /tmp/lite | cut -f1)"
  if [[ -f /tmp/lite/config.json ]]; then
    ATLAS_BENCH_MODEL=/tmp/lite timeout 200 $B/bench/cuda/atlas_cuda_model_bench 2>&1 | tee "$out/bench_model.log" | tail -8
    nvidia-smi --query-gpu=memory.used --format=csv
  fi
fi
exit $rc

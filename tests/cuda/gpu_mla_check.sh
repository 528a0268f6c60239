#!/usr/bin/env bash
# MLA attention on a GPU machine, from an already built build directory (full or ATLAS_CUDA_ONLY):
#   tests/cuda/gpu_mla_check.sh BUILD_DIR
# 1. the MLA tests three times (each run draws fresh random inputs; the seed is in the log),
# 2. compute-sanitizer memcheck and racecheck on the MLA tests that launch few kernels,
# 3. the MLA benchmarks (tensor-core vs scalar kernel, decode and prefill).
# Logs under $OUT (the device tool's folder) or ./gpu-out. Exit status: non-zero if any test
# run or sanitizer run failed. Not a CTest script (no test_ prefix): it needs a GPU.
set -uo pipefail
build=${1:?usage: tests/cuda/gpu_mla_check.sh BUILD_DIR}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
tests=$build/tests/cuda/atlas_cuda_tests
bench=$build/bench/cuda/atlas_cuda_bench
[[ -x $tests ]] || { echo "no $tests: build atlas_cuda_tests first" >&2; exit 2; }
filter='Mla*:Reference.Mla*:ForwardOps.Mla*:ForwardOpsReference.Mla*'
rc=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$out/mla-probe.log"
for rep in 1 2 3; do
  start=$(date +%s)
  "$tests" --gtest_filter="$filter" >"$out/mla-tests-$rep.log" 2>&1
  r=$?
  echo "== MLA tests run $rep rc=$r in $(( $(date +%s) - start )) s:" \
    "$(grep -E '^\[  PASSED' "$out/mla-tests-$rep.log")" \
    "$(grep -cE '^\[  SKIPPED \] [A-Z]' "$out/mla-tests-$rep.log") skipped" \
    "$(grep -E '^\[  FAILED  \] [A-Z]' "$out/mla-tests-$rep.log" | tr '\n' ' ')"
  if [[ $r -ne 0 ]]; then
    rc=$r
    grep -E -B2 -A8 'Failure|seed [0-9]+' "$out/mla-tests-$rep.log" | head -80
  fi
done

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$tests" \
      --gtest_filter='Mla.SmallAndOddShapes:Mla.RowResultIsBatchInvariant:Mla.BadLengthIsReported:Mla.OtherSplitSizesFollowTheContract' \
      >"$out/mla-sanitizer-$tool.log" 2>&1
    r=$?
    echo "== compute-sanitizer $tool rc=$r ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/mla-sanitizer-$tool.log" | tail -1))"
    [[ $r -ne 0 ]] && { rc=$r; grep -E -m 20 'Invalid|Race|Error|hazard' "$out/mla-sanitizer-$tool.log"; }
  done
else
  echo "== no compute-sanitizer"
fi

if [[ -x $bench ]]; then
  "$bench" --benchmark_filter='Mla' --benchmark_counters_tabular=true 2>&1 | tee "$out/mla-bench.log" | tail -16
else
  echo "== no $bench (Google Benchmark missing at configure time?)"
fi
exit "$rc"

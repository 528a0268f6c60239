#!/usr/bin/env bash
# Builds atlas_cuda_tests (+ atlas_cuda_bench) on a GPU machine in CUDA-only mode and runs them,
# logs under $OUT (the device tool's folder) or ./gpu-out. Not a CTest script (no test_ prefix).
#   tests/cuda/gpu_run.sh [googletest-source-dir]   (used only when libgtest-dev is missing)
# If the build there fails, binaries prebuilt elsewhere in ./prebuilt are run instead.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
{
  echo "== probe"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2; cmake --version | head -1; echo "ninja $(ninja --version)"; nproc
  head -2 /etc/os-release; ldd --version | head -1
  ls -d /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/benchmark 2>&1
  pkg-config --list-all 2>/dev/null | grep -i -E 'onig|utf8proc|zip' || echo "pkg-config: no onig/utf8proc/libzip"
  command -v compute-sanitizer || echo "no compute-sanitizer"
} 2>&1 | tee "$out/probe.log"

gtest_arg=()
if [[ ! -d /usr/include/gtest && -n "${1:-}" ]]; then gtest_arg=(-DATLAS_GTEST_SOURCE_DIR="$1"); fi
start=$(date +%s)
{
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DATLAS_CUDA_ONLY=ON "${gtest_arg[@]}" &&
    cmake --build build-gpu -j"$(nproc)"
} >"$out/build.log" 2>&1
echo "== build rc=$? in $(( $(date +%s) - start )) s (log: build.log)"
grep -E "warning|error" "$out/build.log" | head -20

tests=build-gpu/tests/cuda/atlas_cuda_tests
bench=build-gpu/bench/cuda/atlas_cuda_bench
if [[ ! -x $tests ]]; then
  echo "== build failed there: running the prebuilt binaries"
  tail -30 "$out/build.log"
  export LD_LIBRARY_PATH=$PWD/prebuilt:${LD_LIBRARY_PATH:-}
  tests=prebuilt/atlas_cuda_tests
  bench=prebuilt/atlas_cuda_bench
fi
echo "== tests: $tests"
"$tests" 2>&1 | tee "$out/tests.log" | grep -E "^\[  (FAILED|SKIPPED|PASSED) |^\[ info|^\[==========|Failure|error" | head -60
rc=${PIPESTATUS[0]}
echo "== tests rc=$rc"
# Two more runs with fresh random inputs (each run draws its own seed).
for rep in 2 3; do
  "$tests" >"$out/tests-$rep.log" 2>&1
  r=$?
  echo "== tests run $rep rc=$r: $(grep -E '^\[  PASSED' "$out/tests-$rep.log") $(grep -E '^\[  FAILED  \] [A-Z]' "$out/tests-$rep.log" | tr '\n' ' ')"
  [[ $r -ne 0 ]] && rc=$r
done

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$tests" \
      --gtest_filter='Elementwise.*:Moe.*:Mla.RowResultIsBatchInvariant:Router.*:Gemm.FmaChainModeIsBitExactToReference:Gemm.TensorCoreKernelIsExactOnIntegerDataInEveryConfig:GroupedGemm.RowsEqualTheDenseGemmOfTheirGroup:GroupedGemm.BadOffsetsRaiseTheDeviceError' \
      >"$out/sanitizer-$tool.log" 2>&1
    echo "== compute-sanitizer $tool rc=$? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.log" | tail -1))"
  done
fi

if [[ ! -x $bench && -x prebuilt/atlas_cuda_bench ]]; then
  export LD_LIBRARY_PATH=$PWD/prebuilt:${LD_LIBRARY_PATH:-}
  bench=prebuilt/atlas_cuda_bench
fi
if [[ -x $bench ]]; then
  echo "== bench: $bench"
  timeout 120 "$bench" 2>&1 | tee "$out/bench.log" | tail -12
fi
exit "$rc"

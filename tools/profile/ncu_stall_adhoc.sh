# ad-hoc: stall breakdown of the cluster GEMM (session 5)
B=/tmp/ab
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in BM_GemmShapes/0/128/18/ BM_GemmShapes/0/1/0/; do
  timeout 150 "$NCU" --clock-control none --kernel-name regex:"gemm_cluster|gemm_splitk" --launch-skip 2 --launch-count 1 \
    --metrics regex:smsp__pcsamp_warps_issue_stalled_.*,smsp__inst_executed.sum,smsp__cycles_active.avg,sm__ctas_launched.sum \
    $B/bench/cuda/atlas_cuda_bench --benchmark_filter="$c" --benchmark_min_time=0.001s > $OUT/stall_${c//\//_}.txt 2>&1
  echo "== $c rc=$?"
  grep -E "smsp__|sm__" $OUT/stall_${c//\//_}.txt | awk '$NF != "0" {print}' | sort -k3 -n -r | head -40
done

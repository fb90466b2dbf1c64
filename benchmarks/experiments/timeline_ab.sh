#!/bin/bash
# Timeline A/B of one-pass backward settings (bias_bwd_timeline.cu's TIMELINE_* axes) on a GPU
# machine, from the repository root:
#   VARIANTS="name:nvcc flags|..." [DTYPES="bf16 fp32"] [ROWS=256] bash benchmarks/experiments/timeline_ab.sh
#   e.g. VARIANTS="base:|stages3:-DTIMELINE_STAGES=3|rows32:-DTIMELINE_ROW_THREADS_16=32"
# builds one binary per variant, runs each twice per dtype in turn (so slow drifts of the GPU hit
# every variant alike), appends everything to $OUT/timeline.txt and prints the summary lines.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
IFS='|' read -ra specs <<<"${VARIANTS:-base:}"
for spec in "${specs[@]}"; do
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/kernels -Icsrc/include \
    ${spec#*:} benchmarks/experiments/bias_bwd_timeline.cu -o /tmp/tl_${spec%%:*} &
done
wait
for run in 1 2; do
  for spec in "${specs[@]}"; do
    for dt in ${DTYPES:-bf16 fp32}; do
      echo "== ${spec%%:*} $dt run$run" | tee -a "$OUT/timeline.txt"
      /tmp/tl_${spec%%:*} ${ROWS:-256} $dt 2>&1 | tee -a "$OUT/timeline.txt" | grep -E "of the copy|event time"
    done
  done
done

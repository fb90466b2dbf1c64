#!/usr/bin/env bash
# Traces of the Hopper forward (a debugging tool, not part of the build or the tests): builds
# probe_sm90.cu against flash_fwd_sm90.cu with sm90_fwd_timeline.patch (thread 0 of every
# warpgroup of CTAs 0-7 records clock64 at each step: K / V ready, GEMMs issued, S ready, softmax
# done, P V done, the epilogue; the producer its TMA issues), for this tree and for each patch of
# TIMELINE_PATCHES applied first (it must leave the lines the timeline patch touches alone), runs
# every shape of TIMELINE_SHAPES ("D causal B S H", ';'-separated) and writes under $OUT (or
# /tmp/out) a trace and a plot per variant and shape, with the summary printed. On the GPU machine:
#   TIMELINE_SHAPES="128 0 16 1024 16" bash benchmarks/experiments/timeline_sm90.sh
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
ROOT=$PWD OUT=${OUT:-/tmp/out}
PY=${PY:-python3}
# TIMELINE_BWD=1: the Hopper backward instead (probe_sm90_bwd.cu with sm90_bwd_timeline.patch: each
# step's GEMM issues and waits, P, dS, the dQ barriers and bulk add; D = 128, shapes "128 causal B S H")
SOURCES=benchmarks/experiments/probe_sm90.cu TRACE_PATCH=sm90_fwd_timeline.patch KIND=fwd
if [ "${TIMELINE_BWD:-0}" = 1 ]; then
  SOURCES="benchmarks/experiments/probe_sm90_bwd.cu csrc/kernels/attention/flash_bwd_sm90.cu"
  TRACE_PATCH=sm90_bwd_timeline.patch KIND=bwd
fi
mkdir -p "$OUT"
build() {  # build NAME [PATCH]
  local dir=/tmp/timeline_$1
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc benchmarks tests "$dir"/
  if [ -n "${2:-}" ]; then
    (cd "$dir" && patch -p1 -s <"$ROOT/$2") || { echo "timeline: $2 does not apply"; return 1; }
  fi
  (cd "$dir" && patch -p1 -s <"$ROOT/benchmarks/experiments/$TRACE_PATCH") ||
    { echo "timeline: the timeline patch does not apply on top of ${2:-this tree}"; return 1; }
  (cd "$dir" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHEXT_CUDA_ARCHS='"sm_90a"' \
    -DFLASHEXT_PROBE_TIMELINE -Icsrc/include -Icsrc/kernels $SOURCES \
    csrc/kernels/attention/flash_fwd_sm90.cu csrc/kernels/common/tma.cpp csrc/kernels/common/device.cpp \
    csrc/kernels/build_info.cpp -o probe >build.log 2>&1) || { echo "timeline: build $1 failed"; tail -20 "$dir/build.log"; return 1; }
}
names=(base)
build base &
i=0
for p in ${TIMELINE_PATCHES:-}; do
  i=$((i + 1)); names+=(v$i); echo "v$i: $p"
  build v$i "$p" &
done
wait
defaults="128 0 16 1024 16;128 1 16 1024 16;64 0 16 1024 32;256 0 16 1024 8"
[ "$KIND" = bwd ] && defaults="128 0 16 1024 16;128 1 4 4096 16"
IFS=';' read -ra shapes <<<"${TIMELINE_SHAPES:-$defaults}"
for shape in "${shapes[@]}"; do
  tag=$(echo "$shape" | tr ' ' '_')
  for n in "${names[@]}"; do
    [ -x "/tmp/timeline_$n/probe" ] || continue
    trace="$OUT/timeline_${KIND}_${n}_$tag.bin"
    echo "== $n $shape: $(PROBE_TIMELINE_OUT=$trace timeout -k 2 20 "/tmp/timeline_$n/probe" $shape | head -1)"
    $PY benchmarks/experiments/plot_sm90_timeline.py --kind $KIND "$trace" "$OUT/timeline_${KIND}_${n}_$tag.png" \
      ${TIMELINE_PLOT_ARGS:-}
  done
done

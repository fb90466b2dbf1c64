#!/usr/bin/env bash
# A probe for the Hopper kernels (a debugging tool, not part of the build or the tests): builds
# probe_sm90.cu against flash_fwd_sm90.cu alone (seconds, not the whole extension) for this tree
# and for each patch of PROBE_PATCHES, then launches every shape of PROBE_SHAPES ("D causal B S H",
# ';'-separated) 20 times under a watchdog and prints per shape OK with the time per launch and a
# hash of the outputs, an error, or HANG. A patch that keeps the math keeps the hashes (a quick
# check that it is right before the A/B runs the tests). The binaries stay in /tmp/probe_NAME/probe
# for more runs in the same call; each shape runs its variants side by side, PROBE_ROUNDS (2) times.
#   PROBE_BWD=1: the Hopper backward instead (probe_sm90_bwd.cu: D = 128, shapes "128 causal B S H").
#   PROBE_TIMELINE=1: traces instead of timings. Each build also gets sm90_fwd_timeline.patch (or
#   sm90_bwd_timeline.patch): thread 0 of every warpgroup of CTAs 0-7 records clock64 at each step
#   (a variant's patch must leave those lines alone); each shape and variant runs once, writing a
#   trace under $OUT (or /tmp/out) that plot_sm90_timeline.py draws beside it, its summary printed.
# On the GPU machine, e.g.:
#   PROBE_PATCHES="/tmp/my_change.patch" PROBE_SHAPES="128 0 16 1024 16" \
#     bash benchmarks/experiments/probe_sm90.sh
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
ROOT=$PWD OUT=${OUT:-/tmp/out}
KIND=fwd SOURCES=benchmarks/experiments/probe_sm90.cu
if [ "${PROBE_BWD:-0}" = 1 ]; then
  KIND=bwd SOURCES="benchmarks/experiments/probe_sm90_bwd.cu csrc/kernels/attention/flash_bwd_sm90.cu"
fi
TRACE=() ROUNDS=${PROBE_ROUNDS:-2}
if [ "${PROBE_TIMELINE:-0}" = 1 ]; then
  TRACE=(-DFLASHEXT_PROBE_TIMELINE) ROUNDS=1
  mkdir -p "$OUT"
fi
build() {  # build NAME [PATCH]
  local dir=/tmp/probe_$1
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc benchmarks tests "$dir"/
  if [ -n "${2:-}" ]; then
    (cd "$dir" && patch -p1 -s <"$ROOT/$2") || { echo "probe: $2 does not apply"; return 1; }
  fi
  if [ ${#TRACE[@]} -gt 0 ]; then
    (cd "$dir" && patch -p1 -s <"$ROOT/benchmarks/experiments/sm90_${KIND}_timeline.patch") ||
      { echo "probe: the timeline patch does not apply on top of ${2:-this tree}"; return 1; }
  fi
  (cd "$dir" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHEXT_CUDA_ARCHS='"sm_90a"' \
    "${TRACE[@]}" -Icsrc/include -Icsrc/kernels $SOURCES csrc/kernels/attention/flash_fwd_sm90.cu \
    csrc/kernels/common/tma.cpp csrc/kernels/common/device.cpp csrc/kernels/build_info.cpp -o probe \
    >build.log 2>&1) || { echo "probe: build $1 failed"; tail -20 "$dir/build.log"; return 1; }
}
names=(base)
build base &
i=0
for p in ${PROBE_PATCHES:-}; do
  i=$((i + 1)); names+=(v$i); echo "v$i: $p"
  build v$i "$p" &
done
wait
echo "built at $SECONDS s"
defaults="64 0 32 512 32;64 1 32 512 32;64 0 1 512 1;64 0 2 8192 32;128 0 32 512 16;128 1 32 512 16;256 0 32 512 8;256 1 32 512 8"
[ "$KIND" = bwd ] && defaults="128 0 16 1024 16;128 1 16 1024 16;128 0 3 1100 12;128 1 4 4096 16"
IFS=';' read -ra shapes <<<"${PROBE_SHAPES:-$defaults}"
for n in "${names[@]}"; do
  [ -x "/tmp/probe_$n/probe" ] || echo "$n: not built"
done
# Shapes outer, variants inner, ROUNDS rounds: each shape's variants run side by side
for shape in "${shapes[@]}"; do
  tag=$(echo "$shape" | tr ' ' '_')
  for round in $(seq "$ROUNDS"); do
    for n in "${names[@]}"; do
      [ -x "/tmp/probe_$n/probe" ] || continue
      trace="$OUT/timeline_${KIND}_${n}_$tag.bin"
      [ ${#TRACE[@]} -gt 0 ] && export PROBE_TIMELINE_OUT=$trace
      echo "$n: $(timeout -k 2 20 "/tmp/probe_$n/probe" $shape || echo "rc=$? for $shape")"
      if [ ${#TRACE[@]} -gt 0 ]; then
        ${PY:-python3} benchmarks/experiments/plot_sm90_timeline.py --kind $KIND "$trace" "${trace%.bin}.png" \
          ${PROBE_PLOT_ARGS:-}
      fi
    done
  done
done

#!/usr/bin/env bash
# The decode probe (a debugging tool, not part of the build or the tests): builds probe_decode.cu
# against a copy of flash_decode.cu, and again against a traced copy (decode_trace.py), for this
# tree and for each patch of PROBE_PATCHES (applied to the copy; a missing patch stops the script,
# one that does not apply or changes nothing is left out with a message), then runs every shape of
# PROBE_SHAPES ("B S [splits] [fp16|bf16] [head dim] [page size]", ';'-separated) for every
# variant in turn, PROBE_ROUNDS (2) times: the plain build's median time, then the traced build's
# block times (every block's in PROBE_TRACE_DIR/*.csv where that is set; PROBE_TRACED=0 leaves the
# traced builds out); last, per shape, each variant's median time over the rounds and its ratio to
# the tree's. Needs no torch (seconds to build).
#   PROBE_PATCHES="/tmp/early.patch" PROBE_SHAPES="32 4096;128 2048" bash benchmarks/experiments/probe_decode.sh
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
ROOT=$PWD
traced=${PROBE_TRACED:-1}
build() {  # build NAME [PATCH]
  local dir=/tmp/probe_decode_$1
  rm -rf "$dir" && mkdir -p "$dir" && cp csrc/kernels/attention/flash_decode.cu "$dir/flash_decode.cu"
  if [ -n "${2:-}" ]; then
    (cd "$dir" && sed 's#csrc/kernels/attention/##g' "$2" | patch -s -p2 flash_decode.cu) ||
      { echo "$1: the patch does not apply"; return 1; }
    cmp -s "$dir/flash_decode.cu" csrc/kernels/attention/flash_decode.cu && { echo "$1: the patch changed nothing"; return 1; }
  fi
  local flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$dir" -Icsrc/kernels/attention -Icsrc/include -Icsrc)
  nvcc "${flags[@]}" benchmarks/experiments/probe_decode.cu csrc/kernels/common/device.cpp -o "$dir/probe" 2>&1 |
    grep -v Warning &
  if [ "$traced" = 1 ]; then
    python3 benchmarks/experiments/decode_trace.py "$dir/flash_decode.cu" "$dir/flash_decode_traced.cu" || return 1
    nvcc "${flags[@]}" -DPROBE_TRACE benchmarks/experiments/probe_decode.cu csrc/kernels/common/device.cpp \
      -o "$dir/probe_trace" 2>&1 | grep -v Warning
  fi
  wait
  [ -x "$dir/probe" ] && { [ "$traced" = 0 ] || [ -x "$dir/probe_trace" ]; } || { echo "$1: the build failed"; return 1; }
}
[ -n "${PROBE_TRACE_DIR:-}" ] && mkdir -p "$PROBE_TRACE_DIR"
for patch in ${PROBE_PATCHES:-}; do
  [ -f "$patch" ] || { echo "probe_decode.sh: no patch $patch"; exit 1; }
done
names=(base)
build base &
for patch in ${PROBE_PATCHES:-}; do
  name=$(basename "$patch" .patch)
  names+=("$name")
  build "$name" "$(realpath "$patch")" &
done
wait
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
IFS=';' read -ra shapes <<<"${PROBE_SHAPES:-32 4096;128 2048;1 32768}"
log=$(mktemp)
for round in $(seq "${PROBE_ROUNDS:-2}"); do
  for shape in "${shapes[@]}"; do
    for name in "${names[@]}"; do
      [ -x /tmp/probe_decode_$name/probe ] || continue
      echo "== $name round $round"
      timeout 60 /tmp/probe_decode_$name/probe $shape
      [ "$traced" = 1 ] || continue
      PROBE_TRACE_CSV=${PROBE_TRACE_DIR:+$PROBE_TRACE_DIR/${name}_${shape// /_}_r$round.csv} \
        timeout 60 /tmp/probe_decode_$name/probe_trace $shape
    done
  done
done | tee "$log"
# Last, per shape: each variant's median over the rounds of the plain build's time, and its ratio
# to the tree's (base) median (below 1: faster).
echo "== summary: median us over the rounds (ratio to base)"
awk '/^== /{name=$2} /^B=/{shape=$1" "$2" "$3" "$4" "$5; sub(/:$/, "", shape); t=$0; sub(/.*: /, "", t); sub(/ us.*/, "", t)
       key=shape SUBSEP name; n[key]++; v[key, n[key]]=t; if (!(shape in seen)) {seen[shape]; order[++ns]=shape}
       if (!(name in named)) {named[name]; names[++nn]=name}}
     function median(key,   i, j, m, a, tmp) {m=n[key]; for (i=1; i<=m; i++) a[i]=v[key, i]
       for (i=1; i<=m; i++) for (j=i+1; j<=m; j++) if (a[j]+0 < a[i]+0) {tmp=a[i]; a[i]=a[j]; a[j]=tmp}
       return m % 2 ? a[(m+1)/2] : (a[m/2]+a[m/2+1])/2}
     END {for (s=1; s<=ns; s++) {line=sprintf("%-38s", order[s]); b=order[s] SUBSEP "base"; mb=(b in n) ? median(b) : 0
       for (k=1; k<=nn; k++) {key=order[s] SUBSEP names[k]; if (!(key in n)) continue; m=median(key)
         line=line sprintf("  %s %.2f", names[k], m) (mb > 0 && names[k] != "base" ? sprintf(" (%.4f)", m/mb) : "")}
       print line}}' "$log"
rm -f "$log"

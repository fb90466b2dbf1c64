#!/usr/bin/env bash
# One device call for decode kernel variants (a debugging tool, not part of the build or the tests):
# the decode probe times the tree against each patch of VARIANTS (paths, space-separated; required),
# PROBE_ROUNDS (3) rounds over the bar's shapes, dense and paged (no traced builds); the variant
# whose ratios to the tree multiply to the least, if below 1, is applied to this tree (patch -p1,
# left applied); then scripts/gpu.sh runs setup, the decode tests and BENCH_RUNS (3) `bench_decode
# --only decode` runs of what the tree now is. Everything goes under $OUT/r, packed into
# $OUT/all.tgz at the end; the probe's summary, the variant chosen and gpu.sh's summary are
# printed. STEPS replaces gpu.sh's steps. The results name the commit as FLASHEXT_GIT_COMMIT (the
# device's copy has no git: pass it) plus the variant applied, e.g. "40ec907+decode_tile_loop_keysptr".
#   VARIANTS="$PWD/a.patch $PWD/b.patch" FLASHEXT_GIT_COMMIT=40ec907 bash benchmarks/experiments/decode_variants_call.sh   (about 500 s)
set -o pipefail
cd "$(dirname "$0")/../.."
E=$PWD/benchmarks/experiments
OUT=${OUT:-$PWD/gpu_out}
R=$OUT/r
mkdir -p "$R"
variants=${VARIANTS:?"set VARIANTS to the patches to time"}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
PROBE_PATCHES="$variants" PROBE_ROUNDS=${PROBE_ROUNDS:-3} PROBE_TRACED=${PROBE_TRACED:-0} \
  PROBE_SHAPES=${PROBE_SHAPES:-"32 4096;64 8192;128 2048;1 32768;8 131072;32 4096 0 fp16;1 32768 0 bf16 128 16;32 4096 0 bf16 128 16;32 4096 0 bf16 128 64"} \
  timeout "${PROBE_TIMEOUT:-240}" bash "$E/probe_decode.sh" >"$R/probe.log" 2>&1
echo "probe: $SECONDS s"
sed -n '/^== summary/,$p' "$R/probe.log"
winner=$(sed -n '/^== summary/,$p' "$R/probe.log" | awk '/^B=/ {
    for (i = 1; i <= NF; i++) if ($i ~ /^\(/) s[$(i - 2)] += log(substr($i, 2) + 0) }
  END { m = 0; for (k in s) if (s[k] < m) { m = s[k]; b = k }; print b }')
export FLASHEXT_GIT_COMMIT=${FLASHEXT_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
winner_patch=
for v in $variants; do [ "$(basename "$v" .patch)" = "$winner" ] && winner_patch=$v; done
if [ -n "$winner_patch" ] && patch -p1 -s <"$winner_patch"; then
  echo "applied $winner"
  FLASHEXT_GIT_COMMIT+="+$winner"
else
  winner=
fi
[ -n "$winner" ] || echo "no variant beat the tree: the tree's own tests and runs follow"
OUT=$R/gpu FLASHEXT_PYTEST_PATHS=${FLASHEXT_PYTEST_PATHS:-"tests/test_kvcache.py tests/test_merge_states.py"} \
  BENCH_RUNS=${BENCH_RUNS:-3} BENCH_DECODE_ARGS=${BENCH_DECODE_ARGS:-"--only decode"} \
  timeout $((${CALL_SECONDS:-570} - SECONDS)) bash scripts/gpu.sh ${STEPS:-setup pytest bench_decode} >"$R/gpu.log" 2>&1
tail -15 "$R/gpu.log"
tar czf "$OUT/all.tgz" -C "$OUT" r && rm -rf "$R"
echo "total: $SECONDS s"

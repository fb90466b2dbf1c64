#!/usr/bin/env bash
# flashext on a GPU machine: install, check, test, sanitize, benchmark, in one call.
#
#   scripts/gpu.sh [STEP ...]   STEP: setup build main pytest ctest sanitize install ptx bench
#                               bench_attention bench_decode bench_models train_gpt serve_gpt hf_llama ab profile
#                               profile_gelu profile_train context_parallel
#                               (default: setup main pytest ctest sanitize install)
#   setup     the README's install command (scripts/setup.sh: the editable no-build-isolation
#             install a new user runs); build: the same extension built in place (setup.py)
#   install   a non-editable install into a fresh venv (system site packages for torch), then
#             `python -m flashext` from outside the source tree
#   ptx       rebuild with only compute_80 PTX (the portable sm_80 path, JIT-compiled by the
#             driver), run the GPU test suite on it, then rebuild the default archs
#   ab        an A/B of attention variants: A is this tree, B (C, ...) a copy built with
#             FLASHEXT_AB_FLAGS="-DNAME=1" added and/or one patch of FLASHEXT_AB_PATCH="FILE [FILE...]"
#             applied (patch -p1; each built incrementally in this tree, then copied out with its
#             extension, the tree restored; FLASHEXT_AB_TESTS="tests/..." runs each variant's tests first;
#             FLASHEXT_AB_OURS / _ANCHOR name the compared column and its anchor);
#             bench_attention --only ${BENCH_AB_SECTION:-fwd} (fwd, or train for the backward) runs
#             A B ... A B ... (narrow it with FLASHEXT_BENCH_SEQLENS/HEAD_DIMS/DTYPES/IMPLS), JSON to
#             $OUT/{a1,b1,...,a2,b2,...}.json, for benchmarks/compare_ab.py; FLASHEXT_AB_BENCH=decode
#             runs bench_decode --only ${BENCH_AB_SECTION:-decode} instead (compared against sdpa_cudnn);
#             FLASHEXT_AB_ROUNDS rounds (default 2); each run ends after FLASHEXT_AB_RUN_TIMEOUT seconds
#             (default 300: a variant that hangs);
#             FLASHEXT_AB_DEADLINE=SECONDS (counted from the step's start): no run starts after it, and
#             the runs done so far are still compared (a call's time limit then cuts no summary)
#   context_parallel  two GPUs or more (the nvidia-h200-x2 kind): tests/test_distributed.py (the ring
#             under NCCL), benchmarks/bench_context_parallel.py and the train_gpt_cp example
#   pytest_each  pytest once per test file, each in its own process (a fault in one file cannot
#             fail the others), FLASHEXT_PYTEST_JOBS at a time (default 4; logs in $OUT/pytest/),
#             FLASHEXT_PYTEST_TIMEOUT seconds each (default 300; ab's variant tests too); the ptx step runs its tests so too
#             (and rebuilds the default archs after, unless FLASHEXT_PTX_RESTORE=0)
#   FLASHEXT_PYTEST_PATHS="tests/test_attention.py"  what pytest runs (default tests)
#   FLASHEXT_PYTEST_ARGS="-k gelu"  extra pytest arguments;  BENCH_ARGS="--quick" for bench_gelu
#   BENCH_RUNS=3  bench_attention's / bench_decode's runs (run i in $OUT/attention_run<i> or decode_run<i>;
#             benchmarks/attention_runs.py gathers their per-point medians into $OUT/attention_runs.json and
#             _sdpa_flash.json for BENCH_ATTENTION_ARGS="--only fwd", attention_train_runs.json and _sdpa_flash.json for "--only train"
#             (one of the two: a run of several sections is refused), decode_runs.json; unset or 1: one run in $OUT
#   TRAIN_GPT_RUNS=3  train_gpt's runs (each eager and compiled, in $OUT/train_gpt_run<i>; gathered by
#             benchmarks/train_gpt_runs.py into $OUT/train_gpt_runs.json, the median run copied to $OUT);
#             profile_train: torch.profiler on the example's training step (host vs GPU time, top kernels)
#   FLASHEXT_SANITIZE_BINARIES="test_kvcache"  the C++ test binaries sanitize checks (default: all);
#             FLASHEXT_SANITIZE_PYTEST=0 leaves out its pytest subset; FLASHEXT_RACECHECK_ARGS="--racecheck-report
#             hazard --print-limit 4" adds racecheck options (each hazard's threads and kind);
#             FLASHEXT_SANITIZE_FILTERS="*Sm90*" the gtest filters (default: the portable tests, then the Hopper ones)
#   FLASHEXT_PROFILE_BWD=1  profile the backward's main kernels instead of the forward
#   FLASHEXT_PROFILE_CUDNN=1  SDPA's cuDNN backend's kernels beside them (the Hopper path's anchor)
#   FLASHEXT_PROFILE_DECODE=1  the decode kernels (split and combine) beside cuDNN's instead
#   FLASHEXT_PROFILE_SHAPES="bf16:256:0:512"  profile's shapes; FLASHEXT_PROFILE_SOURCE=1 adds
#             per-instruction stall sampling (attention_source.csv); FLASHEXT_PROFILE_KERNELS="."
#             replaces the kernel-name regex (`.`: every launch, e.g. all of cuDNN's backward)
#
# Logs go to $OUT/gpu.log (or ./gpu_out when OUT is unset), benchmark JSON and plots to $OUT;
# a summary of every step is printed last and written to $OUT/summary.txt. FLASHEXT_PACK=1 then
# packs everything under $OUT into $OUT/out.tgz beside summary.txt (the device tool brings back
# at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
export OUT
LOG=$OUT/gpu.log
: >"$LOG"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(setup main pytest ctest sanitize install)
summary=()

run_step() {  # run_step NAME COMMAND...: log it, time it, record pass/fail
  local name=$1
  shift
  echo "===== $name: $*" | tee -a "$LOG"
  local start=$SECONDS
  "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  # (the GPU's SM clock and temperature at the step's end: a sustained load may lower the clock)
  local state
  state=$(nvidia-smi -i 0 --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader 2>/dev/null | head -1)
  local line="$name: $([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start)) s${state:+ (GPU after: $state)}"
  summary+=("$line")
  echo "===== $line" | tee -a "$LOG"
  return "$rc"
}

# The files an interrupted `ab` left built from a variant's sources (AB_MARK lists them): touched,
# so that the build compiles them again from this tree's.
AB_MARK=build/ab_variant_files
ab_unmark() { [ -f "$AB_MARK" ] && { xargs -r touch -c <"$AB_MARK"; rm -f "$AB_MARK"; }; return 0; }
build() { ab_unmark; $PY setup.py build_ext --inplace; }
setup() { PYTHON=$PY bash scripts/setup.sh; }
cpp_build() {  # cpp_build [DIR [ARCHS]]: the C++ tests, for the archs given (default: the build's)
  local dir=${1:-build/cpp} archs=${2:-${FLASHEXT_CUDA_ARCHS:-90a}}
  cmake -S tests/cpp -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" \
    -DFLASHEXT_CUDA_ARCHS="$archs" >/dev/null && cmake --build "$dir" -j "$MAX_JOBS"
}
ctest_run() { cpp_build && ctest --test-dir build/cpp --output-on-failure --timeout 120; }
sanitize() {  # every check runs and prints its verdict; the step fails if any did
  cpp_build || return 1
  local failed=()
  check() {  # check LABEL COMMAND...: run it, remember the label if it fails
    local label=$1
    shift
    echo "sanitize: $label"
    "$@" || failed+=("$label")
  }
  # (the Hopper kernels' tests apart from the portable ones', so that each verdict names its kernels)
  local tool binary filter checks=0 filters racecheck_args
  read -r -a filters <<<"${FLASHEXT_SANITIZE_FILTERS:-"-*Sm90* *Sm90*"}"  # (read: no glob expansion)
  read -r -a racecheck_args <<<"${FLASHEXT_RACECHECK_ARGS:-}"
  for tool in memcheck racecheck; do
    for binary in ${FLASHEXT_SANITIZE_BINARIES:-test_gelu test_attention test_attention_backward test_kvcache test_sm90}; do
      for filter in "${filters[@]}"; do
        [ "$tool" = racecheck ] && [ "$binary" = test_gelu ] && [ -z "${FLASHEXT_SANITIZE_FILTERS:-}" ] && filter='*BiasGelu*'
        # (a filter that selects no test of this binary: nothing to check; a binary that cannot
        # list its tests fails the step)
        local listed
        if ! listed=$(build/cpp/$binary --gtest_list_tests "--gtest_filter=$filter"); then
          failed+=("$binary: cannot list its tests")
          continue
        fi
        grep -q '^  ' <<<"$listed" || continue
        checks=$((checks + 1))
        local extra=()
        [ "$tool" = racecheck ] && extra=("${racecheck_args[@]}")
        check "$tool $binary $filter" compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 9 build/cpp/$binary \
          --gtest_brief=1 "--gtest_filter=$filter"
        [ "$binary" = test_gelu ] && break
      done
    done
  done
  # a small pytest subset through the torch glue: views, unaligned starts, in-place, the edges of
  # attention's numerics, and the bad-input fuzz (nothing may be launched)
  [ "${FLASHEXT_SANITIZE_PYTEST:-1}" = 0 ] || check "memcheck pytest subset" timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all \
    $PY -m pytest -q -p no:cacheprovider tests/test_gelu.py tests/test_attention.py tests/test_online_softmax.py \
    tests/test_bad_input_fuzz.py tests/test_attention_backward.py tests/test_kvcache.py tests/test_merge_states.py \
    tests/test_block_sparse.py tests/test_attention_sm90.py \
    -k "views and bfloat16 or in_place and float32 or any_start_alignment or huge_logits and float16 or nan \
    or empty or bad_calls or no_key or varlen_rows or packed_views or past_capacity or page_ids_outside \
    or paged_cache and 257 \
    or merge_edge or special_masks or mask_layouts or random_masks and bfloat16 and 64 and 7 \
    or head_dims_on_the_next_kernel and 96 and False or test_varlen and bfloat16 and not 128 and not 40"
  [ "$checks" -gt 0 ] || failed+=("no C++ test checked")
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'sanitize: FAILED: %s\n' "${failed[@]}"
    return 1
  fi
  echo "sanitize: every check clean"
}

profile() {  # Nsight Compute on one launch per shape of flashext and SDPA flash (profile_attention.py)
  # FLASHEXT_PROFILE_SOURCE=1 adds the per-instruction stall sampling (SourceCounters) and exports
  # it as SASS-level CSV to $OUT/attention_source.csv.
  local source=()
  [ "${FLASHEXT_PROFILE_SOURCE:-0}" = 1 ] && source=(--section SourceCounters)
  local kernels=flash_fwd
  [ "${FLASHEXT_PROFILE_BWD:-0}" = 1 ] && kernels="flash_bwd_kernel|flash_bwd_sm90|flash_bwd_dq_dk_dv"
  [ "${FLASHEXT_PROFILE_CUDNN:-0}" = 1 ] && kernels="$kernels|cudnn|fprop|dgrad|sdpa|sm90"
  [ "${FLASHEXT_PROFILE_DECODE:-0}" = 1 ] && kernels="flash_decode|cudnn|fprop|sdpa|sm90"
  kernels=${FLASHEXT_PROFILE_KERNELS:-$kernels}  # (a regex of its own: `.` profiles every launch)
  ncu --clock-control none -k "regex:$kernels" -f -o "$OUT/attention_profile" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables "${source[@]}" $PY benchmarks/profile_attention.py || return 1
  if [ ${#source[@]} -gt 0 ]; then
    ncu -i "$OUT/attention_profile.ncu-rep" --page source --csv --print-source sass >"$OUT/attention_source.csv" ||
      echo "profile: the SASS source export failed (see ncu --help for this version's --page source options)"
  fi
  ncu_export attention_profile attention
}

profile_gelu() {  # Nsight Compute: duration, throughput and stall reasons of each bias + GeLU launch (profile_gelu.py)
  ncu --clock-control none -k regex:gelu -f -o "$OUT/gelu_profile" --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    $PY benchmarks/profile_gelu.py || return 1
  ncu_export gelu_profile gelu
  grep -E "gelu|Duration|DRAM Throughput|Grid Size|Block Size|No Eligible" "$OUT/gelu_profile.txt"
}

ncu_export() {  # ncu_export REPORT PREFIX: $OUT/REPORT.txt (details), PREFIX_stalls.csv and its summary PREFIX_stalls.txt
  ncu -i "$OUT/$1.ncu-rep" --page details >"$OUT/$1.txt"
  ncu -i "$OUT/$1.ncu-rep" --page raw --csv \
    --metrics "regex:smsp__average_warps?_issue_stalled_.*_per_issue_active.ratio" >"$OUT/$2_stalls.csv"
  $PY benchmarks/ncu_stalls.py "$OUT/$2_stalls.csv" | tee "$OUT/$2_stalls.txt"
}

install() {  # a new user's non-editable install, run from outside the tree
  local venv=/tmp/flashext_install_venv
  # A fresh venv that sees this interpreter's packages (torch) through a .pth line: a venv's
  # --system-site-packages reaches the base interpreter's, not those of a venv it was made from.
  rm -rf "$venv" && $PY -m venv "$venv" || return 1
  $PY -c "import site; print(site.getsitepackages()[0])" >"$("$venv/bin/python" -c "import site; print(site.getsitepackages()[0])")/parent.pth"
  "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps "$ROOT" || return 1
  (cd /tmp && env -u PYTHONPATH "$venv/bin/python" -c "import flashext; print('imported from', flashext.__file__)" &&
    env -u PYTHONPATH "$venv/bin/python" -m flashext)
}

pytest_files() {  # pytest_files [PYTEST ARGS...]: each test file in a process of its own, several at once
  local jobs=${FLASHEXT_PYTEST_JOBS:-4} dir=$OUT/pytest rc=0 f log
  local files=(${FLASHEXT_PYTEST_PATHS:-tests/test_*.py})
  mkdir -p "$dir"
  for f in "${files[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.5; done
    log="$dir/$(basename "$f" .py).log"
    (timeout "${FLASHEXT_PYTEST_TIMEOUT:-300}" $PY -m pytest -q -p no:cacheprovider --tb=short "$f" "$@" \
      ${FLASHEXT_PYTEST_ARGS:-} >"$log" 2>&1; echo "exit $?" >>"$log") &
  done
  wait
  for f in "${files[@]}"; do
    log="$dir/$(basename "$f" .py).log"
    local code result
    code=$(tail -1 "$log" | sed 's/exit //')
    result=$(grep -E "[0-9]+ (passed|failed|skipped|deselected|error)" "$log" | tail -1)
    echo "$f: ${result:-no summary} (exit $code)"
    if [ "$code" != 0 ] && [ "$code" != 5 ]; then  # 5: nothing collected (all deselected)
      rc=1
      grep -E "^(FAILED|ERROR)" "$log" | head -20
      tail -30 "$log"
    fi
  done
  return $rc
}

ptx() {  # the portable path: compute_80 PTX only, JIT-compiled on this GPU, under the GPU tests
  local archs=${FLASHEXT_PTX_ARCHS:-compute_80}
  FLASHEXT_CUDA_ARCHS=$archs build >/dev/null || return 1
  command -v cuobjdump >/dev/null && cuobjdump --list-ptx --list-elf flashext/_C*.so | sort | uniq -c | head
  $PY -c "import flashext; i = flashext.build_info(); print(i['cuda_archs'], i['ptx'], i['device_supported']); \
assert i['device_supported'] and i['ptx'], i" || return 1
  pytest_files -m "not large"
  local rc=$?
  cpp_build build/cpp_ptx "$archs" && ctest --test-dir build/cpp_ptx --output-on-failure --timeout 300 || rc=1
  # back to the default archs for the steps after (FLASHEXT_PTX_RESTORE=0 when ptx is the last)
  [ "${FLASHEXT_PTX_RESTORE:-1}" = 1 ] && build >/dev/null
  return $rc
}

train_gpt() {  # the training example, eager and compiled, TRAIN_GPT_RUNS times (run i in $OUT/train_gpt_run<i>
  # when more than one; the example's bar is judged on the median run)
  local runs=${TRAIN_GPT_RUNS:-1} i dir
  for i in $(seq 1 "$runs"); do
    dir=$OUT
    [ "$runs" -gt 1 ] && dir=$OUT/train_gpt_run$i
    $PY -m flashext.examples.train_gpt --out "$dir" ${TRAIN_GPT_ARGS:-} | tr '\r' '\n' | grep -v "^\S* *\[" &&
      $PY -m flashext.examples.train_gpt --compile --out "$dir" ${TRAIN_GPT_ARGS:-} | tr '\r' '\n' |
      grep -v "^\S* *\[" || return 1
  done
  [ "$runs" -gt 1 ] && { $PY benchmarks/train_gpt_runs.py "$OUT" "$OUT"/train_gpt_run* || return 1; }
  return 0
}

bench_runs() {  # bench_runs attention|decode [ARGS...]: bench_<name>.py BENCH_RUNS times (run i in
  # $OUT/<name>_run<i>), then the per-point medians a bar inside run-to-run noise is judged on
  # (benchmarks/attention_runs.py); BENCH_RUNS unset or 1: one run into $OUT, nothing gathered
  local name=$1 runs=${BENCH_RUNS:-1} i
  shift
  [[ "$runs" =~ ^[0-9]+$ ]] || { echo "bench_runs: BENCH_RUNS=$runs is not a count"; return 2; }
  [ "$runs" -le 1 ] && { $PY "benchmarks/bench_$name.py" "$@"; return; }
  # what each run writes and what the gathered file is called: bench_attention runs one section
  # (--only fwd: attention.json, issue 18's head dims; --only train: attention_train.json)
  local file=decode.json section=decode out=$OUT/decode_runs.json dims=() only="" arg prev=""
  if [ "$name" = attention ]; then
    for arg in "$@"; do
      [ "$prev" = --only ] && only=$arg
      [[ "$arg" == --only=* ]] && only=${arg#--only=}
      prev=$arg
    done
    case $only in
      fwd) file=attention.json section=fwd out=$OUT/attention_runs.json dims=(--head-dims 64,128,256) ;;
      train) file=attention_train.json section=train out=$OUT/attention_train_runs.json ;;
      *) echo "bench_runs: BENCH_RUNS needs BENCH_ATTENTION_ARGS with --only fwd or --only train"; return 2 ;;
    esac
  fi
  for i in $(seq 1 "$runs"); do
    OUT=$OUT/${name}_run$i $PY "benchmarks/bench_$name.py" "$@" || return 1
  done
  local files=()
  for i in $(seq 1 "$runs"); do files+=("$OUT/${name}_run$i/$file"); done
  $PY benchmarks/attention_runs.py "$out" "${files[@]}" --section "$section" "${dims[@]}" || return 1
  if [ "$section" != decode ]; then
    $PY benchmarks/attention_runs.py "${out%.json}_sdpa_flash.json" "${files[@]}" --section "$section" "${dims[@]}" \
      --anchor sdpa_flash || echo "bench_runs: no SDPA flash column to gather"
  fi
  return 0
}

ab() {  # A = this tree; B, C, ... = copies, one per patch in FLASHEXT_AB_PATCH (space-separated)
  [ -n "${FLASHEXT_AB_FLAGS:-}${FLASHEXT_AB_PATCH:-}" ] ||
    { echo "ab: set FLASHEXT_AB_FLAGS (variant B's nvcc flags) or FLASHEXT_AB_PATCH (patches, one per variant)"; return 2; }
  local ab_start=$SECONDS deadline=${FLASHEXT_AB_DEADLINE:-0}
  build >/dev/null || return 1
  local patches=(${FLASHEXT_AB_PATCH:-}) names=(a) dirs=("$ROOT") letters=(b c d e f) i
  [ ${#patches[@]} -eq 0 ] && patches=("")  # flags alone: one variant
  [ ${#patches[@]} -le ${#letters[@]} ] || { echo "ab: at most ${#letters[@]} variants (patches) per run"; return 2; }
  # The variants build one after the other in this tree (patch, an incremental build: only the
  # files the patch touches and the link, the patch taken back), each copied out with its own
  # extension, so that a variant costs its own files' compiles and not a whole build in a fresh
  # directory; A's extension is put back at the end. A variant that fails to apply, build or pass
  # its tests is reported and left out of the timings.
  # Whatever happens (a failure, a signal), the tree gets its sources back (touched, so that no
  # variant's object is taken for A's) and A's extension: ab_restore, also on INT and TERM (PIPE
  # ignored meanwhile: a TERM to the process group also ends run_step's tee, and a write to it
  # must not end this shell before the restore); AB_MARK tells a later build which files to
  # recompile if even that did not run.
  local -A pid=()
  local dropped=0 so excludes=(--exclude=./build --exclude=./gpu_out) applied=""
  so=flashext/_C$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  cp "$so" /tmp/flashext_ab_a.so || return 1
  case $OUT in "$ROOT"/*) excludes+=("--exclude=./${OUT#"$ROOT"/}") ;; esac
  ab_restore() {
    if [ -n "$applied" ] && patch -p1 -R -s --dry-run <"$ROOT/$applied" >/dev/null 2>&1; then
      patch -p1 -R -s <"$ROOT/$applied" || echo "ab: could not take back $applied"
    fi
    applied=""
    ab_unmark
    cp /tmp/flashext_ab_a.so "$so"
  }
  trap '' PIPE
  trap 'ab_restore; exit 130' INT
  trap 'ab_restore; exit 143' TERM
  for i in "${!patches[@]}"; do
    local name=${letters[$i]} dir=/tmp/flashext_ab_${letters[$i]} patch=${patches[$i]}
    pid[$name]=built
    rm -rf "$dir" && mkdir -p "$dir" || { ab_restore; trap - INT TERM PIPE; return 1; }
    if [ -n "$patch" ] && ! patch -p1 -s --dry-run <"$ROOT/$patch" >"$OUT/ab_build_$name.log" 2>&1; then
      echo "ab: variant $name ($patch) does not apply:"; tail -5 "$OUT/ab_build_$name.log"; pid[$name]=; dropped=1
      continue
    fi
    if [ -n "$patch" ]; then
      mkdir -p build && sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$ROOT/$patch" >"$AB_MARK"
      applied=$patch  # (before it applies: a signal during the patch takes back what it did)
      patch -p1 -s <"$ROOT/$patch" || { ab_restore; trap - INT TERM PIPE; return 1; }
    fi
    FLASHEXT_NVCC_FLAGS="${FLASHEXT_NVCC_FLAGS:-} ${FLASHEXT_AB_FLAGS:-}" $PY setup.py build_ext --inplace \
      >>"$OUT/ab_build_$name.log" 2>&1 ||
      { echo "ab: variant $name ($patch) failed to build:"; tail -20 "$OUT/ab_build_$name.log"; pid[$name]=; dropped=1; }
    # the variant's tree without the build directory (its extension is in flashext/)
    if [ -n "${pid[$name]}" ] && ! { tar -C "$ROOT" "${excludes[@]}" -cf - . | tar -C "$dir" -xf -; }; then
      ab_restore; trap - INT TERM PIPE; return 1
    fi
    ab_restore
  done
  trap - INT TERM PIPE
  echo "ab: variants built at ${SECONDS} s"
  if [ -n "${FLASHEXT_AB_TESTS:-}" ]; then  # each variant's own tests first: a faster wrong kernel is no result
    # The variants' tests run at once, except those marked large (past 2^31 elements: about 25 GB
    # each, which four at once would not find on an 80 GB card): each variant's large ones run once
    # its others are done, one variant at a time (pytest's exit 5, nothing collected, is a pass).
    for i in "${!patches[@]}"; do
      local name=${letters[$i]}
      [ -n "${pid[$name]}" ] || continue
      (cd "/tmp/flashext_ab_$name" && timeout -k 10 "${FLASHEXT_PYTEST_TIMEOUT:-300}" $PY -m pytest -q -p no:cacheprovider \
        -x -m "not large" $FLASHEXT_AB_TESTS >"$OUT/ab_tests_$name.log" 2>&1) &
      pid[$name]=$!
    done
    for i in "${!patches[@]}"; do
      local name=${letters[$i]} rc=0
      [ -n "${pid[$name]}" ] || continue
      echo "ab: variant $name (${patches[$i]}) tests:"
      wait "${pid[$name]}" || [ $? = 5 ] || rc=1
      [ $rc = 0 ] && tail -1 "$OUT/ab_tests_$name.log"
      if [ $rc = 0 ]; then
        (cd "/tmp/flashext_ab_$name" && timeout -k 10 "${FLASHEXT_PYTEST_TIMEOUT:-300}" $PY -m pytest -q -p no:cacheprovider \
          -x -m large $FLASHEXT_AB_TESTS >>"$OUT/ab_tests_$name.log" 2>&1) || [ $? = 5 ] || rc=1
        [ $rc = 0 ] && tail -1 "$OUT/ab_tests_$name.log"
      fi
      [ $rc = 0 ] ||
        { tail -30 "$OUT/ab_tests_$name.log"; echo "ab: variant $name's tests failed or ran past ${FLASHEXT_PYTEST_TIMEOUT:-300} s"; pid[$name]=; dropped=1; }
    done
    echo "ab: variants tested at ${SECONDS} s"
  fi
  for i in "${!patches[@]}"; do
    local name=${letters[$i]}
    [ -n "${pid[$name]}" ] || continue
    names+=("$name")
    dirs+=("/tmp/flashext_ab_$name")
  done
  [ ${#names[@]} -gt 1 ] || { echo "ab: no variant left to time"; return 1; }
  local round bench=attention section=${BENCH_AB_SECTION:-fwd} anchor=sdpa_flash
  # (SDPA flash as the compared anchor unless FLASHEXT_BENCH_IMPLS leaves it out: then cuDNN)
  [ -n "${FLASHEXT_BENCH_IMPLS:-}" ] && [[ ",$FLASHEXT_BENCH_IMPLS," != *,sdpa_flash,* ]] && anchor=sdpa_cudnn
  [ "${FLASHEXT_AB_BENCH:-attention}" = decode ] && bench=decode section=${BENCH_AB_SECTION:-decode} anchor=sdpa_cudnn
  for round in $(seq "${FLASHEXT_AB_ROUNDS:-2}"); do
    for i in "${!names[@]}"; do
      local run=${names[$i]}$round
      if [ "$deadline" -gt 0 ] && [ $((SECONDS - ab_start)) -ge "$deadline" ]; then
        echo "ab: run $run left out (FLASHEXT_AB_DEADLINE, $deadline s, has passed)"
        continue
      fi
      echo "ab: run $run (at ${SECONDS} s)"
      rm -rf /tmp/flashext_ab_out_$run
      (cd "${dirs[$i]}" && OUT=/tmp/flashext_ab_out_$run timeout -k 10 "${FLASHEXT_AB_RUN_TIMEOUT:-300}" \
        $PY benchmarks/bench_$bench.py --only "$section" | { grep -E "vs |of read_anchor" || true; }) ||
        { echo "ab: run $run failed or ran past ${FLASHEXT_AB_RUN_TIMEOUT:-300} s (a hang?)"; return 1; }
      cp /tmp/flashext_ab_out_$run/$bench*.json "$OUT/$run.json"
    done
  done
  local compare=(--ours "${FLASHEXT_AB_OURS:-flashext}" --anchor "${FLASHEXT_AB_ANCHOR:-$anchor}")
  for i in "${!names[@]}"; do
    [ "$i" = 0 ] && continue
    for round in $(seq "${FLASHEXT_AB_ROUNDS:-2}"); do
      [ -f "$OUT/a$round.json" ] && [ -f "$OUT/${names[$i]}$round.json" ] || continue
      echo "ab: a$round vs ${names[$i]}$round"
      $PY benchmarks/compare_ab.py "$OUT/a$round.json" "$OUT/${names[$i]}$round.json" "${compare[@]}" | tail -2
    done
  done
  return $dropped
}

for step in "${steps[@]}"; do
  case $step in
    setup) run_step setup setup || break ;;  # nothing else can run without the extension
    build) run_step build build || break ;;
    main) run_step "python -m flashext" $PY -m flashext ;;
    pytest) run_step pytest $PY -m pytest -q -p no:cacheprovider ${FLASHEXT_PYTEST_PATHS:-tests} ${FLASHEXT_PYTEST_ARGS:-} ;;
    pytest_each) run_step "pytest, a process per file" pytest_files ;;
    ctest) run_step ctest ctest_run ;;
    sanitize) run_step compute-sanitizer sanitize ;;
    bench) run_step bench_gelu $PY benchmarks/bench_gelu.py ${BENCH_ARGS:-} ;;
    bench_attention) run_step "bench_attention x ${BENCH_RUNS:-1}" bench_runs attention ${BENCH_ATTENTION_ARGS:-} ;;
    bench_decode) run_step "bench_decode x ${BENCH_RUNS:-1}" bench_runs decode ${BENCH_DECODE_ARGS:-} ;;
    bench_models) run_step bench_models $PY benchmarks/bench_models.py ${BENCH_MODELS_ARGS:-} ;;
    serve_gpt) run_step "serve_gpt (batch 1 and 32)" bash -c "$PY -m flashext.examples.serve_gpt --batch 1 --out $OUT && $PY -m flashext.examples.serve_gpt --batch 32 --out $OUT" ;;
    hf_llama) run_step "examples/hf_llama.py" $PY examples/hf_llama.py ;;
    train_gpt) run_step "train_gpt (eager, compiled) x ${TRAIN_GPT_RUNS:-1}" train_gpt ;;
    profile_train) run_step "profile_train (eager, compiled)" bash -c "$PY benchmarks/profile_train_gpt.py && $PY benchmarks/profile_train_gpt.py --compile" ;;
    ab) run_step "ab (${FLASHEXT_AB_FLAGS:-}${FLASHEXT_AB_PATCH:+ $FLASHEXT_AB_PATCH})" ab ;;
    profile) run_step profile profile ;;
    profile_gelu) run_step profile_gelu profile_gelu ;;
    install) run_step "install (non-editable, from /tmp)" install ;;
    ptx) run_step "ptx (compute_80 only) pytest" ptx ;;
    context_parallel) run_step "context parallel (ring attention over the GPUs)" bash -c \
      "$PY -m pytest -q -p no:cacheprovider tests/test_distributed.py && $PY benchmarks/bench_context_parallel.py \
      --out $OUT && $PY -m flashext.examples.train_gpt_cp --out $OUT" ;;
    *) echo "unknown step $step" ; exit 2 ;;
  esac
done

{
  echo
  echo "==== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit ${FLASHEXT_GIT_COMMIT:-unknown})"
  printf '%s\n' "${summary[@]}"
  grep -E "^(summary|  (add|add_bwd|bias|bias_bwd) |  (fp16|bf16) D=|  vs )" "$LOG" | tail -90 || true
  grep -E "^[0-9]+ (passed|failed)|passed|failed" "$LOG" | grep -E "^=*\s*[0-9]+ (passed|failed)" | tail -3 || true
} | tee "$OUT/summary.txt"

if [ "${FLASHEXT_PACK:-0}" = 1 ]; then
  tar czf /tmp/flashext_out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 ! -name summary.txt -delete &&
    mv /tmp/flashext_out.tgz "$OUT/out.tgz"
fi

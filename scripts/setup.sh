#!/usr/bin/env bash
# Install what flashext needs, only what is missing (so nothing touches the network when all is
# there, as on a GPU box without one), then build it in place: pip install --no-build-isolation -e .
#   torch 2.14.1 only when there is no torch (a GPU box keeps its own), numpy (Triton's
#   interpreter), ninja, pytest, cmake, a setuptools that builds editable wheels (>= 64; below
#   70.1 with the `wheel` package) and GoogleTest (Debian's libgtest-dev, for the C++ tests).
# Safe to run again. PYTHON=... picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}  # nvcc on PATH may be a wrapper elsewhere
PY=${PYTHON:-python3}
# ninja and cmake from pip land beside the interpreter (a venv's bin/, active or not)
export PATH=$CUDA_HOME/bin:$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH

has() { "$PY" -c "import $1" 2>/dev/null; }
need=()
has torch || need+=(torch==2.14.1)
has numpy || need+=(numpy)
has pytest || need+=(pytest)
command -v ninja >/dev/null || need+=(ninja)
command -v cmake >/dev/null || need+=(cmake)
if has setuptools.command.editable_wheel; then  # setuptools >= 64; below 70.1 bdist_wheel is wheel's
  has setuptools.command.bdist_wheel || has wheel.bdist_wheel || need+=(wheel)
else
  need+=("setuptools>=70.1")
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup.sh: installing ${need[*]}"
  "$PY" -m pip install -q "${need[@]}"
fi

if [ ! -f /usr/include/gtest/gtest.h ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup.sh: installing libgtest-dev"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
  else
    echo "setup.sh: GoogleTest is missing; install libgtest-dev to build the C++ tests" >&2
  fi
fi

MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install -q --no-build-isolation --no-deps -e .
"$PY" - <<'EOF'
import sys, flashext
info = flashext.build_info()
if not info["built"]:
    sys.exit(f"setup.sh: {info['import_error']}")
print(f"flashext {info['version']} built for {', '.join(info['cuda_archs'])} (torch {info['torch']})")
EOF

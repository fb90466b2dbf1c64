#!/usr/bin/env bash
# Install what flashext needs and build it in place (editable). Safe to run again.
#   torch 2.14.1 (only when no torch is installed: a GPU box keeps its own), ninja, pytest,
#   cmake, GoogleTest (Debian's libgtest-dev, for the C++ tests), then
#   pip install --no-build-isolation -e .
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}  # nvcc on PATH may be a wrapper elsewhere
export PATH=$CUDA_HOME/bin:$PATH
PY=${PYTHON:-python3}

if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q torch==2.14.1
fi
$PY -m pip install -q ninja pytest cmake
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
  else
    echo "setup.sh: GoogleTest is missing; install libgtest-dev to build the C++ tests" >&2
  fi
fi
MAX_JOBS=${MAX_JOBS:-$(nproc)} $PY -m pip install -q --no-build-isolation --no-deps -e .
$PY -c "import flashext; print('flashext', flashext.__version__, flashext.build_info())"

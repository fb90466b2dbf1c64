#!/usr/bin/env bash
# The whole test suite: pytest (CPU tests everywhere, GPU tests where CUDA is visible), then the
# C++ GoogleTest suite through CMake/ctest. Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
PY=${PYTHON:-python3}

$PY -m pytest -q -p no:cacheprovider tests "$@"
cmake -S tests/cpp -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" >/dev/null
cmake --build build/cpp -j "${MAX_JOBS:-$(nproc)}"
ctest --test-dir build/cpp --output-on-failure

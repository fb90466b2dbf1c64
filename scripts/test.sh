#!/usr/bin/env bash
# The whole test suite: pytest (CPU tests everywhere, GPU tests where CUDA is visible), then the
# C++ GoogleTest suite through CMake/ctest, built for FLASHEXT_CUDA_ARCHS (default 90a) like the
# extension. Run scripts/setup.sh first. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PYTHON:-python3}
export PATH=$CUDA_HOME/bin:$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH

"$PY" -m pytest -q -p no:cacheprovider tests "$@"
cmake -S tests/cpp -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" -DFLASHEXT_CUDA_ARCHS="${FLASHEXT_CUDA_ARCHS:-90a}" >/dev/null
cmake --build build/cpp -j "${MAX_JOBS:-$(nproc)}"
ctest --test-dir build/cpp --output-on-failure

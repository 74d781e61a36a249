#!/usr/bin/env bash
# Configures and builds into build/ (CUDA backend too when nvcc is present). Extra args go to cmake.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# Unity-built libraries: a clean build about a quarter faster (pass -DDELTAFLOW_UNITY=OFF for file-at-a-time edits).
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTAFLOW_CUDA=$cuda -DDELTAFLOW_UNITY=ON "$@"
ninja -C "$here/build"

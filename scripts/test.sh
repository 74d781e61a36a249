#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test but the GPU ones (label gpu).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/install-deps.sh"
"$here/scripts/build.sh"
export PATH="$here/.venv/bin:$PATH"
cd "$here/build"
ctest -LE gpu --output-on-failure -j2 --timeout 1500

#!/usr/bin/env bash
# The main job: installs dependencies, builds, and serves the default model (models/house) on
# http://127.0.0.1:8000 (OpenAI and Ollama APIs). With arguments, runs `deltaflow ARGS` instead.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/install-deps.sh"
"$here/scripts/build.sh"
bin="$here/build/src/deltaflow"
if [ $# -gt 0 ]; then
  exec "$bin" "$@"
fi
exec "$bin" serve

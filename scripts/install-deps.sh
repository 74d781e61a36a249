#!/usr/bin/env bash
# Installs what Deltaflow builds and tests with, on Debian or Ubuntu, as root (or through sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
pkgs=(build-essential cmake ninja-build pkg-config git python3 python3-pip python3-venv
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libboost-dev libgtest-dev libgmock-dev
      libpng-dev libjpeg-dev libwebp-dev libgif-dev zlib1g-dev
      curl jq chromium)  # curl, jq: the README's examples (tested); chromium: the chat page's browser test
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Python packages for the end-to-end tests (official clients), in a venv of the repository's own.
here=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$here/.venv/bin/python" ]; then
  python3 -m venv "$here/.venv"
fi
"$here/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/tests/requirements.txt"

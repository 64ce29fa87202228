#!/usr/bin/env bash
# README command 1: install what is missing, build, run the demo on the embedded tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)"
./build/tetra demo

#!/usr/bin/env bash
# Installs the Debian 12 packages Tetra builds with (the CUDA toolkit is assumed present).
set -euo pipefail
pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev git nlohmann-json3-dev libcli11-dev
      libgtest-dev libcpp-httplib-dev python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "note: nvcc found at /usr/local/cuda/bin (add it to PATH)" >&2
  else
    echo "error: the CUDA toolkit (nvcc) is required; install CUDA 13 first" >&2
    exit 1
  fi
fi

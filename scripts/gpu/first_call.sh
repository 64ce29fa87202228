#!/usr/bin/env bash
# Session opener on one H200: decode benchmark, per-kernel profile, then the gpu tests of the
# newest code paths. bash scripts/gpu/first_call.sh BIN_DIR OUT_DIR
set -uo pipefail
bin="$1"; out="$2"; L="$out/logs"; mkdir -p "$L"
[ -f "$bin/bins.tar.xz" ] && tar -xJf "$bin/bins.tar.xz" -C "$bin"
bin=$(realpath "$bin")
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" HOME="${HOME:-/tmp}"
s() { local n="$1" secs="$2"; shift 2; local t0=$(date +%s)
  timeout "$secs" "$@" > "$L/$n.log" 2>&1; echo "$n rc=$? $(( $(date +%s) - t0 ))s" >> "$L/summary.txt"
  tar -C "$out" -czf "$out/all.tgz" logs; }
s decode_air 150 "$bin/tetra" bench decode --preset glm4.5-air --random-weights --batch 1,64 \
  --context 1024 --prefill-tokens 0 --markdown "$L/decode-air.md"
s parts 60 "$bin/tests/bench_decode_parts"
s profile 260 bash scripts/gpu/profile_kernels.sh "$bin" "$L/prof"
for t in ${TESTS:-test_runtime_ops_cuda test_linear_cuda test_split_decode_attention test_model_cuda}; do
  s "$t" 90 "$bin/tests/$t"; done
cat "$L/summary.txt"

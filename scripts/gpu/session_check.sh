#!/usr/bin/env bash
# The closing check of a session on one H200, from binaries built on the development machine:
#   bash scripts/gpu/session_check.sh BIN_DIR OUT_DIR
# Benchmarks first (alone on the GPU), then the gpu tests, then a short per-kernel profile.
# summary.txt lists each step's exit status and seconds; all.tgz holds every log.
set -uo pipefail
bin="$1"; out="$2"; L="$out/logs"; mkdir -p "$L"
[ -f "$bin/bins.tar.xz" ] && tar -xJf "$bin/bins.tar.xz" -C "$bin"
bin=$(realpath "$bin"); here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" HOME="${HOME:-/tmp}"
s() { local n="$1" secs="$2"; shift 2; local t0=$(date +%s)
  timeout "$secs" "$@" > "$L/$n.log" 2>&1; echo "$n rc=$? $(( $(date +%s) - t0 ))s" >> "$L/summary.txt"
  tar -C "$out" -czf "$out/all.tgz" logs; }
t="$bin/tetra"
s decode_air 150 "$t" bench decode --preset glm4.5-air --random-weights --batch 1,64 \
  --context 1024 --prefill-tokens 4096 --json "$L/decode-air.json" --markdown "$L/decode-air.md"
s moe_glm5 90 "$t" bench moe --preset glm5 --tokens 1,16,64 --json "$L/moe-glm5.json" \
  --markdown "$L/moe-glm5.md"
s moe_air 60 "$t" bench moe --preset glm4.5-air --tokens 1,16,64 --json "$L/moe-air.json" \
  --markdown "$L/moe-air.md"
for b in ${BENCHES:-bench_decode_parts bench_attention_decode bench_token_path}; do
  [ -x "$bin/tests/$b" ] && s "$b" 90 "$bin/tests/$b"; done
for x in ${TESTS:-test_linear_cuda test_split_decode_attention test_moe_ops_cuda test_w4a16_moe \
    test_router_logits_tiled test_model_cuda test_runtime_ops_cuda test_moe_layer}; do
  [ -x "$bin/tests/$x" ] && s "$x" 200 "$bin/tests/$x"; done
s demo 60 "$t" demo --cache-dir "$out/cache"
NCU_COUNT=200 s profile 120 bash "$here/profile_kernels.sh" "$bin" "$L/prof"
cat "$L/summary.txt"

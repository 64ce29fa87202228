#!/bin/bash
# One device call: correctness test on GPU 1 while the decode-range sweep (1/16/64 tokens, no
# tiled variants) times on GPU 0. Usage from the repo root: bash bench/moe_kernels/run_sweep.sh DIR
# (DIR holds test_w4a16_moe and bench_w4a16_moe). Logs go to $OUT.
set -u
dir=${1:-gpu-run-h9}
out=${OUT:-/tmp/moe_out}
mkdir -p "$out"
cd "$dir" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/gpu.txt" 2>&1
(CUDA_VISIBLE_DEVICES=1 timeout 150 ./test_w4a16_moe > "$out/test.log" 2>&1; echo "test rc=$?" >> "$out/test.log") &
CUDA_VISIBLE_DEVICES=0 TETRA_BENCH_FULL=1 TETRA_BENCH_TOKENS=${TOKENS:-1,16,64} TETRA_BENCH_NO_TILED_SMALL=1 \
  timeout 150 ./bench_w4a16_moe > "$out/bench.log" 2>&1
echo "bench rc=$?" >> "$out/bench.log"
wait
grep -E "^\[  (PASSED|FAILED) |FAILED \]|Failure|nmse|Expected|Which is|rc=" "$out/test.log" | head -40
grep -E "^\||rc=|Failure" "$out/bench.log"

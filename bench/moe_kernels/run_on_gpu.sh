#!/bin/bash
# Runs the W4A16 MoE correctness test and benchmark on the GPU machine; logs go to $OUT.
# Usage (from the repo root, binaries copied to build-d2-run/ beforehand):
#   bash bench/moe_kernels/run_on_gpu.sh [test|bench|both]
set -u
what=${1:-both}
out=${OUT:-/tmp/moe_out}
mkdir -p "$out"
cd build-d2-run || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/gpu.txt" 2>&1
if [ "$what" != bench ]; then
  timeout 300 ./test_w4a16_moe > "$out/test.log" 2>&1; echo "test rc=$?" >> "$out/test.log"
  grep -E "^\[  (PASSED|FAILED) |OK \]|FAILED \]|Failure|nmse|Expected|Which is|rc=" "$out/test.log" | head -60
fi
if [ "$what" != test ]; then
  TETRA_BENCH_FULL=1 timeout 400 ./bench_w4a16_moe > "$out/bench.log" 2>&1; echo "bench rc=$?" >> "$out/bench.log"
  grep -E "^\||rc=|Failure" "$out/bench.log"
fi

#!/usr/bin/env bash
# One call on a 2-GPU H200 machine (device kind nvidia-h200-x2): the 2-GPU vs 1-GPU logits test,
# then `tetra bench decode` of GLM-4.5-Air at tp1 / tp2 / tp2+ep2 / ep2 and the largest GLM-4.7
# that fits at tp2+ep2. Binaries come prebuilt in $BIN (default gpu-run-h10); logs and results go
# to $OUT (a tarball of logs + the bench markdown/json).
set -u
BIN=${BIN:-gpu-run-h10}
OUT=${OUT:-/tmp/parallel-out}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L="$OUT/logs"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$L/gpus.txt" 2>&1
nvidia-smi topo -m >> "$L/gpus.txt" 2>&1
timeout 150 "$BIN/test_parallel_model" > "$L/test_parallel_model.txt" 2>&1
echo "test rc $?" >> "$L/status.txt"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs
bench() {  # name, args...
  local name=$1; shift
  timeout 120 "$BIN/tetra" bench decode "$@" --json "$OUT/$name.json" --markdown "$L/$name.md" \
    > "$L/$name.txt" 2>&1
  echo "$name rc $?" >> "$L/status.txt"
  tar -C "$OUT" -czf "$OUT/logs.tgz" logs  # after each step: a killed call still brings logs
}
A="--preset glm4.5-air --random-weights --batch 1,64 --context 1024 --prefill-tokens 2048 --iters 20"
bench air-tp1 $A
bench air-tp2 $A --tp 2
bench air-tp2-ep2 $A --tp 2 --ep 2
bench air-ep2 $A --ep 2 --no-per-op
G="--preset glm4.7 --random-weights --batch 1,64 --context 1024 --prefill-tokens 1024 --iters 20"
bench glm47-tp2-ep2 $G --tp 2 --ep 2
grep -q "glm47-tp2-ep2 rc 0" "$L/status.txt" || bench glm47-46layers-tp2-ep2 $G --tp 2 --ep 2 --layers 46
tar -C "$OUT" -czf "$OUT/logs.tgz" logs

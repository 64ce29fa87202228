#!/usr/bin/env bash
# One GPU-machine call: every gpu test, the quantize pipeline checked with Python safetensors,
# and a >10 GB BF16 checkpoint quantized on the GPU and on the CPU (bytes compared, GB/s shown).
# usage (on the GPU machine, from the repo root): bash scripts/gpu/verify_foundation.sh BIN_DIR
set -uo pipefail
G=${1:-gpu-run}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$S"
for t in test_nvfp4_cuda test_moe_ops_cuda test_runtime_ops_cuda test_w4a16_moe; do
  timeout 240 "$G/$t" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')" | tee -a "$S"
  grep -E '^\[  FAILED  \]' "$OUT/$t.log" | head -20 | tee -a "$S"
done
timeout 200 compute-sanitizer --tool memcheck "$G/test_nvfp4_cuda" --gtest_filter='*Quantize*' \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck test_nvfp4_cuda rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log")" | tee -a "$S"

T=/tmp/tt && rm -rf $T && mkdir -p $T
{
  "$G/tetra" make-model --preset tiny-glm5 --dtype bf16 $T/a &&
  "$G/tetra" quantize $T/a $T/b && "$G/tetra" quantize --device cpu --quiet $T/a $T/bc &&
  "$G/tetra" inspect $T/b && python3 tests/reference/check_nvfp4_checkpoint.py $T/b --reference $T/a
} > "$OUT/pipeline.log" 2>&1
echo "tiny pipeline rc=$? $(tail -1 "$OUT/pipeline.log")" | tee -a "$S"
cmp $T/b/model.safetensors $T/bc/model.safetensors && echo "tiny: GPU and CPU outputs identical" | tee -a "$S"

B=/tmp/big && rm -rf $B $B-q $B-qc
{
  /usr/bin/time -v "$G/tetra" make-model --preset glm4.5-air --layers 3 --dtype bf16 $B 2>&1 | grep -E "wrote|Maximum resident|Elapsed"
  du -sh $B
  /usr/bin/time -v "$G/tetra" quantize --device cuda $B $B-q 2>&1 | grep -E "quantized|time|Maximum resident|Elapsed|cuda"
  /usr/bin/time -v "$G/tetra" quantize --device cpu --quiet $B $B-qc 2>&1 | grep -E "quantized|time|Maximum resident|Elapsed"
  for f in $B-q/*.safetensors; do cmp "$f" "$B-qc/$(basename "$f")" || echo "DIFFER $f"; done
  echo "compared $(ls $B-q/*.safetensors | wc -l) shards"
  python3 tests/reference/check_nvfp4_checkpoint.py $B-q | tail -3
} > "$OUT/big.log" 2>&1
cat "$OUT/big.log" | tee -a "$S"

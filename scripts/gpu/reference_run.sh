#!/usr/bin/env bash
# One GPU-machine call for the reference comparison (issue 4): compare_hf.py (every variant, bf16
# and nvfp4, cpu and cuda backends, against transformers) and routing_evidence.py (why the
# random-router variants miss 2e-2), side by side, logs and tables under OUT.
# usage: scripts/gpu/reference_run.sh TETRA_BINARY OUT_DIR [PER_SCRIPT_TIMEOUT_S]
# LENGTHS=1,5,17,300 (say) sets compare_hf.py's prompt lengths (default 1,5,17,40).
set -u
tetra=$(realpath "$1")
out=$2
limit=${3:-150}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cd "$(dirname "$0")/../../tests/reference"
{ python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$out/versions.txt" 2>&1
# Each python takes part of the cores; tetra's cpu backend uses its own threads.
OMP_NUM_THREADS=6 timeout "$limit" python3 compare_hf.py --tetra "$tetra" --work /tmp/ref-cmp \
  --backends cpu,cuda --decode-steps 64 --lengths "${LENGTHS:-1,5,17,40}" > "$out/compare_hf.log" 2>&1 &
cmp_pid=$!
OMP_NUM_THREADS=6 timeout "$limit" python3 routing_evidence.py --tetra "$tetra" --work /tmp/ref-ev \
  --backends cpu,cuda --decode-steps 64 --out "$out/routing_evidence.md" \
  --rows "$out/routing_evidence_rows.json" > "$out/routing_evidence.log" 2>&1 &
ev_pid=$!
wait $cmp_pid; cmp_rc=$?
wait $ev_pid; ev_rc=$?
echo "compare_hf.py exit $cmp_rc, routing_evidence.py exit $ev_rc" | tee "$out/status.txt"
tail -n 20 "$out/compare_hf.log"
exit $cmp_rc

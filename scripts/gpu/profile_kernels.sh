#!/usr/bin/env bash
# Per-kernel hardware counters of the decode step and the 1-token MoE layer (Nsight Compute),
# to see which kernels sit far from the HBM roof and why (occupancy, registers, grid size):
#   bash scripts/gpu/profile_kernels.sh BIN_DIR OUT_DIR
# Few layers (--layers) keep the profile short; the per-kernel figures are what matter here, the
# whole-step figures come from `tetra bench decode` without a profiler.
set -uo pipefail
bin=$(realpath "$1"); out="$2"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" HOME="${HOME:-/tmp}"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size
metrics+=,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,launch__occupancy_limit_registers,launch__shared_mem_per_block
prof() {  # prof NAME SECONDS CMD...
  local name="$1" secs="$2"; shift 2
  timeout "$secs" ncu --clock-control none --metrics "$metrics" --csv --page raw \
    --launch-count "${NCU_COUNT:-600}" "$@" > "$out/$name.csv" 2> "$out/$name.err"
  echo "$name rc=$?" >> "$out/summary.txt"
}
t="$bin/tetra"
dec="bench decode --preset glm4.5-air --random-weights --layers 3 --context 1024 --prefill-tokens 0 --iters 2 --no-per-op --no-graphs"
prof decode_b1 150 "$t" $dec --batch 1
prof decode_b64 150 "$t" $dec --batch 64
prof moe_glm5_t1 120 "$t" bench moe --preset glm5 --tokens 1 --backend cuda-w4a16 --iters 5
prof moe_air_t1 120 "$t" bench moe --preset glm4.5-air --tokens 1 --backend cuda-w4a16 --iters 5

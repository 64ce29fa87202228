#!/usr/bin/env bash
# Where a kernel's issue slots go (Nsight Compute sections: pipe utilisation, warp stalls,
# instruction mix) and its SASS, for the W4A16 decode kernels:
#   bash scripts/gpu/profile_pipes.sh BIN_DIR OUT_DIR [KERNEL_REGEX]
set -uo pipefail
bin=$(realpath "$1"); out="$2"; re="${3:-regex:moe_decode|gemv|stream}"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" HOME="${HOME:-/tmp}"
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats"
sections+=" --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy"
run() {  # run NAME SECONDS CMD...
  local name="$1" secs="$2"; shift 2
  timeout "$secs" ncu --clock-control none $sections -k "$re" --launch-skip 4 --launch-count 3 \
    "$@" > "$out/$name.txt" 2> "$out/$name.err"
  echo "$name rc=$?" >> "$out/summary.txt"
}
run moe_glm5_t1 150 "$bin/tetra" bench moe --preset glm5 --tokens 1 --backend cuda-w4a16 --iters 3
run moe_glm5_t64 150 "$bin/tetra" bench moe --preset glm5 --tokens 64 --backend cuda-w4a16 --iters 3
# SASS of the decode kernels, one file per function (names demangled by cu++filt where present)
cuobjdump --dump-sass "$bin/tetra" 2>/dev/null | awk -v d="$out/sass" '
  BEGIN { system("mkdir -p " d) }
  /Function :/ { n++; f = sprintf("%s/f%03d.sass", d, n) }
  f { print > f }' 
grep -lE "${SASS_RE:-moe_decode_kernel|gemv|stream}" "$out"/sass/*.sass 2>/dev/null | head -60 > "$out/sass_index.txt"
for f in "$out"/sass/*.sass; do grep -qx "$f" "$out/sass_index.txt" || rm -f "$f"; done
for f in $(cat "$out/sass_index.txt"); do
  printf '%s %s\n' "$(grep -m1 'Function :' "$f")" "$(grep -c '/\*[0-9a-f]*\*/' "$f")"; done > "$out/sass_sizes.txt"
tar -C "$out" -czf "$out/sass.tgz" sass && rm -rf "$out/sass"

#!/bin/bash
# Builds only the W4A16 MoE test and bench binaries (no full tetra_lib: other parts of the tree
# may be mid-edit). Needs the CUDA toolkit and GoogleTest (static) installed.
# OBJ_DIR / RUN_DIR (default build-d2/fast, build-d2-run): object and binary folders.
set -e
cd "$(dirname "$0")/../.."
obj=${OBJ_DIR:-build-d2/fast}
run=${RUN_DIR:-build-d2-run}
mkdir -p "$obj" "$run"
NVCC="/usr/local/cuda/bin/nvcc -std=c++20 -O3 -I src -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -DTETRA_GIT_COMMIT=\"$(git rev-parse --short=12 HEAD)\""
srcs="src/core/error.cpp src/core/cuda_check.cpp src/moe/expert_weights.cpp $(ls src/ops/moe/w4a16_*.cu)"
pids=()
for s in $srcs tests/gpu/test_w4a16_moe.cpp tests/gpu/bench_w4a16_moe.cu; do
  o="$obj/$(echo "$s" | tr / _).o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find src/ops/moe src/moe -newer "$o" -name '*.h*' 2>/dev/null)" ]; then
    $NVCC -x cu -c "$s" -o "$o" -Xcompiler -Wall &
    pids+=($!)
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
libobjs=""
for s in $srcs; do libobjs="$libobjs $obj/$(echo "$s" | tr / _).o"; done
for t in test_w4a16_moe bench_w4a16_moe; do
  o=$(ls $obj/tests_gpu_${t}.*.o)
  $NVCC $o $libobjs -o $run/$t -lgtest -lgtest_main -lpthread -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc
done
ls -la "$run"

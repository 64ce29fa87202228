#!/usr/bin/env bash
# One call on the GPU machine that checks and times everything, from binaries built on the
# development machine (ignored folder sent with the device tool's `carry`):
#   bash scripts/gpu/verify_all.sh BIN_DIR OUT_DIR [full|quick|tests]
# BIN_DIR holds `tetra` and tests/ (or bins.tar.xz of them). One GPU: the benchmarks run first,
# alone, then the gpu tests beside the transformers comparison. Two or more GPUs: tests on GPU 0,
# benchmarks on the last GPU at the same time, then the 2-GPU tests and parallel benchmarks.
# `quick` runs the tests that cover the newest code paths instead of every gpu test, and the
# MoE benchmark without its 4096-token row. `tests` runs full's tests, reference comparison and
# serve load test without the benchmarks.
# Every step has its own timeout and log; summary.txt lists each step's exit status and time;
# OUT_DIR/all.tgz holds every log (refreshed after each step, so a killed call still has them).
set -uo pipefail
bin="$1"; out="$2"; mode="${3:-full}"
mkdir -p "$out/logs"
if [ -f "$bin/bins.tar.xz" ]; then tar -xJf "$bin/bins.tar.xz" -C "$bin"; fi
bin=$(realpath "$bin")
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export HOME="${HOME:-/tmp}" NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "$0")" && pwd)
ngpu=$(nvidia-smi -L | wc -l)
bench_gpu=$((ngpu - 1))
logs="$out/logs"
nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
summary="$logs/summary.txt"

step() {  # step NAME SECONDS GPU CMD...
  local name="$1" secs="$2" gpu="$3"; shift 3
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES="$gpu" timeout "$secs" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" >> "$summary"
  tar -C "$out" -czf "$out/all.tgz" logs
}

tests_lane() {
  local tests="test_nvfp4_cuda test_moe_ops_cuda test_runtime_ops_cuda test_w4a16_moe test_w4a4_moe
               test_bf16_moe test_linear_cuda test_split_decode_attention test_paged_extend_attention
               test_router_logits_tiled test_model_cuda"
  [ "$mode" = quick ] && tests="test_runtime_ops_cuda test_linear_cuda test_paged_extend_attention
                                test_moe_ops_cuda test_model_cuda"
  for t in $tests; do step "$t" 240 0 "$bin/tests/$t"; done
  # 300 s: TokenPathSettingsAgree alone takes ~100 s beside the reference lane (120 s cut it in
  # session 21, every case passed when re-run)
  [ "$mode" = quick ] && step test_moe_layer_new 300 0 "$bin/tests/test_moe_layer" \
    --gtest_filter='*W4a4*:*ExpertParallel*:*TokenPath*:*CapturedGraph*:*Tiny*'
  step demo_cuda 120 0 "$bin/tetra" demo --cache-dir "$out/cache"
  [ "$mode" = quick ] || step memcheck_moe_layer 180 0 compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$bin/tests/test_moe_layer" --gtest_filter='*MostExpertsEmpty*:*AllTokensOnOneExpert*'
  # The GEMVs' shared-memory hand-offs (the stream kernel's bulk-copy ring): 0 hazards since
  # session 21 made every consumer thread arrive on the ring's empty barrier.
  [ "$mode" = quick ] || step racecheck_gemv 240 0 compute-sanitizer --tool racecheck \
    --error-exitcode 1 "$bin/tests/test_linear_cuda" --gtest_filter='*Nvfp4GemvSeveralOutputsMatchCpu*'
  # The BF16 GEMV (lm_head at 1-2 rows): its odd shapes under memcheck.
  [ "$mode" = quick ] || step memcheck_bf16_gemv 180 0 compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$bin/tests/test_linear_cuda" --gtest_filter='*Bf16*'
}

# test_moe_layer in its own lane beside tests_lane (full modes): its real-shape cases alone take
# ~235 s, so in series the tests outgrew a call's 10 minutes; as two steps so that a cut in the
# shapes cannot hide the cases after them (a failure among those went unseen from session 19 to 24).
moe_layer_lane() {
  [ "$mode" = quick ] && return
  step test_moe_layer_shapes 300 0 "$bin/tests/test_moe_layer" --gtest_filter='*Shape*'
  step test_moe_layer_rest 240 0 "$bin/tests/test_moe_layer" --gtest_filter='-*Shape*'
}

bench_lane() {
  local t="$bin/tetra"
  local glm5_tokens=1,16,64,4096
  [ "$mode" = quick ] && glm5_tokens=1,16,64
  step bench_moe_glm5 200 "$bench_gpu" "$t" bench moe --preset glm5 --tokens "$glm5_tokens" \
    --json "$logs/moe-glm5.json" --markdown "$logs/moe-glm5.md"
  step bench_moe_air 90 "$bench_gpu" "$t" bench moe --preset glm4.5-air --tokens 1,16,64 \
    --json "$logs/moe-air.json" --markdown "$logs/moe-air.md"
  step bench_decode_air 220 "$bench_gpu" "$t" bench decode --preset glm4.5-air --random-weights \
    --batch 1,64 --context 1024 --prefill-tokens 4096 --json "$logs/decode-air.json" \
    --markdown "$logs/decode-air.md"
}

reference_lane() {  # Tetra vs transformers (tests/reference), cpu + cuda backends
  step reference 200 0 bash "$here/reference_run.sh" "$bin/tetra" "$logs/reference" 190
}

serve_load() {  # tiny demo model on cuda: a KV pool and prefill budget small enough to preempt
  local port=18080
  CUDA_VISIBLE_DEVICES=0 "$bin/tetra" serve --port $port --backend cuda --max-running 64 \
    --kv-blocks 96 --kv-block-size 16 --max-prefill-tokens 64 --cache-dir "$out/cache" \
    > "$logs/serve.log" 2>&1 &
  local pid=$!
  local url="http://127.0.0.1:$port"
  for _ in $(seq 60); do
    python3 -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  step bench_serve 120 0 "$bin/tetra" bench serve --url "$url" \
    --concurrency 1,8,64 --requests 128 --input-len 200 --output-len 64 \
    --json "$logs/serve.json" --markdown "$logs/serve.md"
  python3 -c "import urllib.request as u; print(u.urlopen('$url/metrics').read().decode())" \
    > "$logs/serve-metrics.txt" 2>&1
  kill -TERM $pid; wait $pid; echo "serve exit=$?" >> "$summary"
}

parallel_lane() {  # tensor / expert parallel on GPUs 0,1: logits test, then decode benchmarks
  local t="$bin/tetra"
  step test_parallel_model 200 0,1 "$bin/tests/test_parallel_model"
  local air="--preset glm4.5-air --random-weights --batch 1,64 --context 1024 --prefill-tokens 2048"
  step bench_decode_air_tp2 150 0,1 "$t" bench decode $air --tp 2 \
    --json "$logs/decode-air-tp2.json" --markdown "$logs/decode-air-tp2.md"
  step bench_decode_air_tp2_ep2 150 0,1 "$t" bench decode $air --tp 2 --ep 2 \
    --json "$logs/decode-air-tp2-ep2.json" --markdown "$logs/decode-air-tp2-ep2.md"
  step bench_decode_glm47_tp2_ep2 150 0,1 "$t" bench decode --preset glm4.7 --random-weights \
    --batch 1 --context 1024 --prefill-tokens 1024 --tp 2 --ep 2 \
    --json "$logs/decode-glm47-tp2-ep2.json" --markdown "$logs/decode-glm47-tp2-ep2.md"
  step test_allreduce 120 0,1 "$bin/tests/test_allreduce"
}

if [ "$ngpu" -ge 2 ]; then
  tests_lane & lane=$!
  moe_layer_lane & moe=$!
  reference_lane & ref=$!
  [ "$mode" = tests ] || bench_lane
  wait $lane $moe $ref
  parallel_lane
else
  [ "$mode" = tests ] || bench_lane
  reference_lane & lane=$!
  moe_layer_lane & moe=$!
  tests_lane
  wait $lane $moe
  serve_load  # (the 2-GPU call spends its time on the parallel lane instead)
fi
tar -C "$out" -czf "$out/all.tgz" logs
cat "$summary"

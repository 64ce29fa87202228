#!/usr/bin/env bash
# One call on the GPU machine that checks and times everything built so far, from binaries built
# on the development machine (ignored folder sent with the device tool's `carry`):
#   bash scripts/gpu/verify_all.sh BIN_DIR OUT_DIR
# BIN_DIR holds `tetra` and tests/ (or bins.tar.xz of them). Two lanes run at once when there are
# two GPUs: the gpu tests on GPU 0, the benchmarks on the last GPU; test_allreduce uses both.
# Every step has its own timeout and log; the summary lists each step's exit status.
set -uo pipefail
bin="$1"; out="$2"
mkdir -p "$out"
if [ -f "$bin/bins.tar.xz" ]; then tar -xJf "$bin/bins.tar.xz" -C "$bin"; fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export HOME="${HOME:-/tmp}"
ngpu=$(nvidia-smi -L | wc -l)
bench_gpu=$((ngpu - 1))
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
summary="$out/summary.txt"

step() {  # step NAME SECONDS GPU CMD...
  local name="$1" secs="$2" gpu="$3"; shift 3
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES="$gpu" timeout "$secs" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" >> "$summary"
}

tests_lane() {
  for t in test_nvfp4_cuda test_moe_ops_cuda test_runtime_ops_cuda test_w4a16_moe test_w4a4_moe \
           test_bf16_moe test_linear_cuda test_split_decode_attention test_moe_layer \
           test_model_cuda; do
    step "$t" 240 0 "$bin/tests/$t"
  done
  step demo_cuda 120 0 "$bin/tetra" demo --cache-dir "$out/cache"
  step memcheck_moe_layer 180 0 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$bin/tests/test_moe_layer" --gtest_filter='*MostExpertsEmpty*:*AllTokensOnOneExpert*'
}

bench_lane() {
  local t="$bin/tetra"
  step bench_moe_glm5 150 "$bench_gpu" "$t" bench moe --preset glm5 --tokens 1,16,64,4096 \
    --json "$out/moe-glm5.json" --markdown "$out/moe-glm5.md"
  step bench_moe_air 90 "$bench_gpu" "$t" bench moe --preset glm4.5-air --tokens 1,16,64 \
    --json "$out/moe-air.json" --markdown "$out/moe-air.md"
  step bench_decode_air 220 "$bench_gpu" "$t" bench decode --preset glm4.5-air --random-weights \
    --batch 1,64 --context 1024 --prefill-tokens 4096 --json "$out/decode-air.json" \
    --markdown "$out/decode-air.md"
}

serve_load() {  # tiny demo model on the cuda backend, 64 concurrent streams
  local port=18080
  CUDA_VISIBLE_DEVICES=0 "$bin/tetra" serve --port $port --backend cuda --max-running 64 \
    --cache-dir "$out/cache" > "$out/serve.log" 2>&1 &
  local pid=$!
  local url="http://127.0.0.1:$port"
  for _ in $(seq 60); do
    python3 -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  step bench_serve 120 0 "$bin/tetra" bench serve --url "$url" \
    --concurrency 1,8,64 --requests 128 --input-len 128 --output-len 128 \
    --json "$out/serve.json" --markdown "$out/serve.md"
  python3 -c "import urllib.request as u; print(u.urlopen('$url/metrics').read().decode())" \
    > "$out/serve-metrics.txt" 2>&1
  kill -TERM $pid; wait $pid; echo "serve exit=$?" >> "$summary"
}

tests_lane &
lane_a=$!
bench_lane
wait $lane_a
serve_load
if [ "$ngpu" -ge 2 ]; then step test_allreduce 120 0,1 "$bin/tests/test_allreduce"; fi
cat "$summary"

#!/usr/bin/env bash
# Builds one fuzzer (libFuzzer + ASan + UBSan, clang++-14) from only the sources it needs and runs
# it for SECONDS (default 60) on a scratch copy of its seed corpus. Exits non-zero on a build
# failure or any finding: crash, sanitizer report, exception other than tetra::Error, broken
# invariant, timeout, leak or memory blow-up. Findings are kept and their path printed.
#   usage: bash fuzz/run.sh [SECONDS] [TARGET]      env: CLANGXX (default clang++-14), FUZZ_JOBS
#   TARGET: safetensors_header (default), tokenizer_json, tokenizer_encode, server_request,
#           model_config
set -euo pipefail
seconds="${1:-60}"
target="${2:-safetensors_header}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cxx="${CLANGXX:-clang++-14}"
jobs="${FUZZ_JOBS:-$(nproc)}"
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz/run.sh: $cxx not found (install clang, libclang-rt-14-dev)" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tetra-fuzz.XXXXXX")"
keep=0
cleanup() { if [ "$keep" = 0 ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

extra=()
case "$target" in
  safetensors_header)
    sources=("$root/fuzz/fuzz_safetensors_header.cpp" "$root"/src/format/safetensors*.cpp
             "$root/src/core/error.cpp" "$root/src/core/dtype.cpp")
    seeds=("$root"/fuzz/corpus/*)
    extra=(-dict="$root/fuzz/safetensors.dict") ;;
  tokenizer_json | tokenizer_encode)
    sources=("$root/fuzz/fuzz_$target.cpp" "$root"/src/tokenizer/*.cpp "$root/src/core/error.cpp")
    if [ "$target" = tokenizer_json ]; then seeds=("$root"/tests/data/tokenizers/*.json)
    else seeds=("$root"/fuzz/corpus_tokenizer_encode/*); fi ;;
  server_request)
    sources=("$root/fuzz/fuzz_server_request.cpp" "$root/src/server/http_message.cpp"
             "$root/src/server/openai_request.cpp" "$root/src/core/error.cpp")
    seeds=("$root"/fuzz/corpus_server_request/*) ;;
  model_config)
    sources=("$root/fuzz/fuzz_model_config.cpp" "$root/src/format/model_config.cpp"
             "$root/src/format/model_layout.cpp" "$root/src/format/model_size.cpp"
             "$root/src/format/quant_config.cpp" "$root/src/format/wildcard.cpp"
             "$root/src/core/error.cpp" "$root/src/core/dtype.cpp")
    seeds=("$root"/tests/data/configs/*.json) ;;
  *) echo "fuzz/run.sh: unknown target '$target' (safetensors_header, tokenizer_json, tokenizer_encode, server_request, model_config)" >&2
     exit 1 ;;
esac
common=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
        -fno-sanitize-recover=all -I "$root/src" -I "$root/fuzz"
        -DTETRA_FUZZ_TOKENIZER_DIR="\"$root/tests/data/tokenizers\"")
start=$(date +%s)
# Objects get coverage instrumentation without libFuzzer's main; the link adds it.
compile_one='src="$1"; shift; obj="$0/$(basename "$src" .cpp).o"
             "$@" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" || exit 255'
printf '%s\n' "${sources[@]}" | xargs -P "$jobs" -I{} sh -c "$compile_one" \
  "$work" {} "$cxx" "${common[@]}"
"$cxx" "${common[@]}" -fsanitize=fuzzer "$work"/*.o -o "$work/fuzz_$target"
echo "fuzz: built in $(( $(date +%s) - start )) s, fuzzing for ${seconds} s"

mkdir -p "$work/corpus" "$work/findings"
cp "${seeds[@]}" "$work/corpus/"
status=0
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
  "$work/fuzz_$target" "$work/corpus" \
  "${extra[@]}" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/findings/" >"$work/fuzz.log" 2>&1 || status=$?
if [ "$status" != 0 ] || [ -n "$(ls -A "$work/findings")" ]; then
  tail -n 60 "$work/fuzz.log"
  keep=1
  echo "fuzz: FINDING (exit $status); inputs in $work/findings, log $work/fuzz.log" >&2
  exit 1
fi
grep -E "^(Done|stat::)" "$work/fuzz.log" || true
echo "fuzz: clean after ${seconds} s ($(( $(date +%s) - start )) s in all)"

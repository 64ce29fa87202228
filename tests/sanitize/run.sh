#!/usr/bin/env bash
# The concurrency code's tests under ThreadSanitizer and AddressSanitizer + UBSan (clang++-14,
# as fuzz/run.sh): the worker pool behind parallel_for (src/core/parallel.*). Built from only the
# sources they need, so it takes seconds; exits non-zero on a build failure, a failed test or any
# sanitizer report.
#   usage: bash tests/sanitize/run.sh        env: CLANGXX (default clang++-14)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cxx="${CLANGXX:-clang++-14}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tetra-sanitize.XXXXXX")"
trap 'rm -rf "$work"' EXIT
sources=("$root/src/core/parallel.cpp" "$root/tests/cpu/test_parallel.cpp")
gtest=(/usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a -lpthread)
for san in thread address,undefined; do
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize="$san" -fno-sanitize-recover=all \
    -I "$root/src" "${sources[@]}" "${gtest[@]}" -o "$work/test_parallel"
  TSAN_OPTIONS="halt_on_error=1" ASAN_OPTIONS="detect_leaks=1" \
    "$work/test_parallel" > "$work/log" 2>&1 || { tail -n 40 "$work/log"; echo "sanitize ($san): FAILED" >&2; exit 1; }
  if grep -q "Sanitizer" "$work/log"; then
    grep -A 30 "Sanitizer" "$work/log" | head -n 60
    echo "sanitize ($san): report" >&2
    exit 1
  fi
  echo "sanitize ($san): test_parallel clean ($(grep -c '^\[       OK' "$work/log") tests)"
done

#!/usr/bin/env bash
# A/B of decode-step variants in ONE call on the GPU machine, rounds interleaved (A B C, A B C, ...)
# so that drift between machines and minutes falls on every variant alike; the way every
# performance change in bench/results was accepted or dropped since session 12.
#   bash scripts/gpu/ab_decode.sh OUT ROUNDS VARIANT...
#   VARIANT: name=BINARY             the tetra binary as it is
#            name=BINARY@K=V,K2=V2   the same with environment knobs set (experiments' switches)
# Environment: BATCHES (default 1,2,4), PRESET (glm4.5-air), CONTEXT (1024), ITERS (20),
# BENCH_ARGS (more arguments for every `bench decode`, e.g. "--logprobs 20"; default none),
# MOE_PRESETS (default empty: e.g. "glm4.5-air glm5" adds `tetra bench moe --tokens MOE_TOKENS`,
# MOE_TOKENS default 1, per variant and round), NULL_CONTROL (default 1: the first variant runs
# twice per round, the second time as "<name>-again", so the summary shows how far identical code
# lands apart in this call; session 33 measured 0.3% with ranges that did not overlap, so a
# difference smaller than the null control's is not a result; 0 turns it off).
# Writes OUT/logs/<variant>.r<round>.{decode,moe-<preset>}.log and prints, per variant and batch,
# the lowest, highest and median of its median us/step over the rounds (and the MoE layer's
# median us).
set -uo pipefail
out="$1"; rounds="$2"; shift 2
[ "$#" -ge 1 ] || { echo "usage: ab_decode.sh OUT ROUNDS name=BINARY[@K=V,...] ..." >&2; exit 2; }
logs="$out/logs"; mkdir -p "$logs"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" HOME="${HOME:-/tmp}"
batches="${BATCHES:-1,2,4}"
names=()
run_variant() {  # run_variant SPEC ROUND
  local spec="$1" r="$2" name="${1%%=*}" rest="${1#*=}" bin knobs=()
  bin="${rest%%@*}"
  if [ "$rest" != "$bin" ]; then IFS=',' read -r -a knobs <<< "${rest#*@}"; fi
  env "${knobs[@]}" timeout 120 "$bin" bench decode --preset "${PRESET:-glm4.5-air}" \
    --random-weights --context "${CONTEXT:-1024}" --prefill-tokens 0 --iters "${ITERS:-20}" \
    --no-per-op --batch "$batches" ${BENCH_ARGS:-} > "$logs/$name.r$r.decode.log" 2>&1 ||
    echo "$name round $r: decode exit $?" >> "$logs/errors.txt"
  for p in ${MOE_PRESETS:-}; do
    env "${knobs[@]}" timeout 120 "$bin" bench moe --preset "$p" --tokens "${MOE_TOKENS:-1}" \
      --backend cuda-w4a16 > "$logs/$name.r$r.moe-$p.log" 2>&1 ||
      echo "$name round $r: moe $p exit $?" >> "$logs/errors.txt"
  done
}
if [ "${NULL_CONTROL:-1}" = 1 ]; then
  first="$1"
  set -- "$@" "${first%%=*}-again=${first#*=}"
fi
for spec in "$@"; do names+=("${spec%%=*}"); done
for r in $(seq "$rounds"); do
  for spec in "$@"; do run_variant "$spec" "$r"; done
done

# Summary: decode rows are "| batch | context | median | ...", MoE rows "| backend | tokens |
# unique experts | median | ...".
{
  echo "| variant | batch | median us/step, lowest-highest over $rounds rounds | their median |"
  echo "|---|---|---|---|"
  for name in "${names[@]}"; do
    cat "$logs/$name".r*.decode.log 2>/dev/null |
      awk -F'|' -v n="$name" '$2 ~ /^ [0-9]+ $/ && $4 ~ /[0-9]/ {
          b = $2 + 0; v = $4 + 0
          if (!(b in lo) || v < lo[b]) lo[b] = v
          if (!(b in hi) || v > hi[b]) hi[b] = v
          k = ++cnt[b]; val[b, k] = v
        }
        END {
          for (b in lo) {
            m = cnt[b]  # insertion sort of the rounds, then their median
            for (i = 2; i <= m; ++i)
              for (j = i; j > 1 && val[b, j - 1] > val[b, j]; --j) {
                t = val[b, j]; val[b, j] = val[b, j - 1]; val[b, j - 1] = t
              }
            med = m % 2 ? val[b, (m + 1) / 2] : (val[b, m / 2] + val[b, m / 2 + 1]) / 2
            printf "| %s | %d | %.1f-%.1f | %.1f |\n", n, b, lo[b], hi[b], med
          }
        }' |
      sort -t'|' -k3n
  done
  for p in ${MOE_PRESETS:-}; do
    echo
    echo "| variant | MoE $p tokens | layer median us over the rounds |"
    echo "|---|---|---|"
    for name in "${names[@]}"; do
      cat "$logs/$name".r*.moe-"$p".log 2>/dev/null |
        awk -F'|' -v n="$name" '$2 ~ /cuda-w4a16/ && NF > 10 { t[$3 + 0] = t[$3 + 0] " " $5 + 0 }
          END { for (k in t) printf "| %s | %d |%s |\n", n, k, t[k] }'
    done
  done
  # (an if, not `[ ... ] &&`: with no errors the summary's exit status must still be 0)
  if [ -f "$logs/errors.txt" ]; then echo; cat "$logs/errors.txt"; fi
} | tee "$out/ab_summary.md"

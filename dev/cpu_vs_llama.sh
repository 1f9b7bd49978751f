#!/usr/bin/env bash
# Issue 12's side-by-side on this machine: llama.cpp's ggml_gated_delta_net (the harness in
# ../shared/anchors/ggml_cpu, built as its README says, by default in /tmp/ggml_cpu) and
# `deltanet bench --device cpu`, interleaved round by round at 2 and 1 threads; prints each
# round's medians and the ratios (llama.cpp's time over ours).
# Usage: dev/cpu_vs_llama.sh [ROUNDS] [DELTANET_BINARY]
# DECODE_ARGS adds arguments to deltanet's decode runs (`--state-v-first`: llama.cpp's layout);
# GGML_ANCHOR names another harness build (one for AVX2: NOTES-CPU.md, thirtieth stop).
set -euo pipefail
ROUNDS=${1:-2}
B=${2:-target/release/deltanet}
G=${GGML_ANCHOR:-/tmp/ggml_cpu/target/release/ggml_gdn_anchor}
if [ ! -x "$G" ]; then
  echo "no llama.cpp harness at $G: cp -r ../shared/anchors/ggml_cpu /tmp/ggml_cpu && (cd /tmp/ggml_cpu && cargo build --release)" >&2
  exit 1
fi
median() { tail -1 | awk '{print $2}'; }
for round in $(seq 1 "$ROUNDS"); do
  for th in 2 1; do
    ll=$("$G" --threads "$th" --runs 7 --warmup 2)
    pick() { echo "$ll" | awk -F'|' -v c="$1" '$2 ~ c {gsub(/ /, "", $5); print $5}'; }
    lp=$(pick "prefill T=4096"); l1=$(pick "decode N=1 "); l16=$(pick "decode N=16")
    run() { RAYON_NUM_THREADS=$th "$B" bench --device cpu --dtype f32 "$@" | median; }
    dp=$(run --work prefill --repeats 7)
    d1=$(run --work decode ${DECODE_ARGS:-} --shape 1,1,16,32,128,128 --repeats 1000 --warmup 50)
    d16=$(run --work decode ${DECODE_ARGS:-} --shape 16,1,16,32,128,128 --repeats 100 --warmup 10)
    echo "round $round, $th threads, load $(cut -d' ' -f1 /proc/loadavg):"
    for w in "prefill T=4096:$lp:$dp" "decode N=1:$l1:$d1" "decode N=16:$l16:$d16"; do
      IFS=: read -r name l d <<<"$w"
      awk -v n="$name" -v l="$l" -v d="$d" 'BEGIN {printf "  %-15s llama.cpp %9.3f ms  deltanet %9.3f ms  %.2fx\n", n, l, d, l / d}'
    done
  done
done

#!/usr/bin/env bash
# The landed candidate: chunk_intra's diagonals, doubling and the doubling on the tensor cores
# in both precisions (measured in call CA), and the recurrent kernel's 16-bit o through shared
# memory with v^T by transposing loads. A/B first: deltanet_before (the same build without the
# recurrent change: stage.sh's binary copied before it) against deltanet, interleaved, both
# precisions; then the checks a landed build runs (selftest in both precisions, fused_equals,
# the fast test, non-finite rows, engine (its 16-bit o case takes the new path), racecheck in
# both precisions, memcheck).
# run(command="bash .dev/all/callCB.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=cb; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
pbb() { local tag=$1; shift; timeout 40 ./deltanet_before bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
{
for P in fast exact; do
  for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128; do
    if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
    for V in before after before after; do
      if [ $V = before ]; then pbb "before $P $s" --precision $P $a --repeats 20
      else pb "after $P $s" --precision $P $a --repeats 20; fi
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
run selftest 120 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run selftest_fast 120 ./deltanet selftest --device cuda --precision fast --vectors $TOP/.gpu/vectors
run fused_equals 120 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
pack
checks_and_sanitizers
pack

#!/usr/bin/env bash
# p formed in the recurrent kernel (Config::p_in_rec, DELTANET_FUSED_PINREC): A/B first, off
# and on interleaved (fast: the forward at B=8, varlen, T=32768 (where it does not apply: the
# split kernel runs the heads that cannot segment) and T=2048, and chunk_intra and the recurrent
# kernel alone at B=8; exact with it forced at B=8 and varlen), then the checks with the fast
# default on (selftest both precisions, fused_equals with its p_in_rec tunings, the fast test,
# non-finite rows, engine, racecheck both precisions with it forced, memcheck fast varlen).
# run(command="bash .dev/all/callCD.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=cd; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
for W in 0 1 0 1; do
  DELTANET_FUSED_ONLY=intra DELTANET_FUSED_PINREC=$W pb "intra-only pinrec=$W fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  DELTANET_FUSED_ONLY=recurrent DELTANET_FUSED_PINREC=$W pb "recurrent-only pinrec=$W fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
done
for P in fast exact; do
  for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    [ $P = exact ] && [ $s != 8,8192,16,32,128,128 ] && [ $s != varlen ] && continue
    if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
    for W in 0 1 0 1; do
      DELTANET_FUSED_PINREC=$W pb "pinrec=$W $P $s" --precision $P $a --repeats 20
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
export DELTANET_FUSED_PINREC=1  # the checks with it on (opt-in until measured)
run selftest_fast 120 ./deltanet selftest --device cuda --precision fast --vectors $TOP/.gpu/vectors
run selftest_exact_pinrec 120 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
pack
checks_and_sanitizers
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_exact_pinrec 90 env DELTANET_FUSED_PINREC=1 DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision exact --shape 2,300,4,8,128,128
run mem_fast_varlen 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack

#!/usr/bin/env bash
# For the next stop (not yet run): HBUF = 2 in chunk_recurrent_regs, correctness first, then
# A/B against the default in the same binary (DELTANET_FUSED_HBUF=0|1), two rounds.
# run(command="bash .dev/all/callAR.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ar; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run fused_equals 150 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=4 DELTANET_FUSED_HBUF=1 ./fused_test fused_keeps_non_finite --nocapture
pack
for round in 1 2; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    for H in 0 1; do
      DELTANET_FUSED_HBUF=$H pb "fast hbuf=$H $s" --precision fast --shape $s --repeats 20
      DELTANET_FUSED_HBUF=$H DELTANET_FUSED_KSPLIT=0 pb "exact noksplit hbuf=$H $s" --precision exact --shape $s --repeats 20
      DELTANET_FUSED_HBUF=$H DELTANET_FUSED_NBUF=1 pb "exact nbuf1 hbuf=$H $s" --precision exact --shape $s --repeats 20
    done
    pb "exact default $s" --precision exact --shape $s --repeats 20
  done
done 2>&1 | tee $R/hbuf.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 70 env DELTANET_FUSED_HBUF=1 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack

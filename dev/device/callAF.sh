#!/usr/bin/env bash
# Two output warps per 16 columns in the split recurrent kernel (DELTANET_FUSED_OUT_WARPS=2,
# host-emulated) against one, and the output warps now queueing the next chunk's rows after
# QH^T: fused tests under both, then exact and fast at B=1, interleaved, two rounds, and the
# recurrent kernel alone.
# run(command="bash .dev/all/callAF.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=af; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run fused_equals 90 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
run engine_ow2 60 env DELTANET_FUSED_OUT_WARPS=2 ./engine_test --test-threads=1
run non_finite 60 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite --nocapture
pack
for round in 1 2; do for P in exact fast; do for w in 1 2; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    DELTANET_FUSED_OUT_WARPS=$w pb "out_warps=$w $P $s" --precision $P --shape $s --repeats 20
  done
done; done; done 2>&1 | tee $R/out_warps.txt
pack
for w in 1 2; do for P in exact fast; do
  DELTANET_FUSED_ONLY=recurrent DELTANET_FUSED_OUT_WARPS=$w pb "recurrent-only out_warps=$w $P" --precision $P --shape 1,32768,16,32,128,128 --repeats 20
done; done 2>&1 | tee $R/recurrent_only.txt
DELTANET_FUSED_OUT_WARPS=2 pb "out_warps=2 exact T=65536" --shape 1,65536,16,32,128,128 --repeats 10 | tee -a $R/out_warps.txt
pack

#!/usr/bin/env bash
# For the next session's first call (both host-emulated, not yet run on a GPU):
# 1. the decode kernel with K = V = 128 as compile-time constants (DELTANET_DECODE_CONST=1)
#    against the generic one, interleaved, with the decode tests under it first;
# 2. staging by every warp of the split recurrent kernel (DELTANET_FUSED_STAGE_ALL=1) against
#    the output warps alone, with the K split (exact) and without (fast), fused tests under it.
# run(command="bash .dev/all/callAD.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ad; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run decode_test_const 60 env DELTANET_DECODE_CONST=1 ./decode_test --test-threads=1
run fused_stage_all 60 env DELTANET_FUSED_CASES=1 DELTANET_FUSED_STAGE_ALL=1 ./fused_test fused_equals --nocapture
run engine_stage_all 60 env DELTANET_FUSED_STAGE_ALL=1 ./engine_test --test-threads=1
pack
for round in 1 2; do for c in 0 1; do
  for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128"; do
    echo "== round $round const=$c $s"; DELTANET_DECODE_CONST=$c db --shape $s
  done
done; done 2>&1 | tee $R/decode_const.txt
pack
for round in 1 2; do for P in exact fast; do for a in 0 1; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    DELTANET_FUSED_STAGE_ALL=$a pb "stage_all=$a $P $s" --precision $P --shape $s --repeats 20
  done
done; done; done 2>&1 | tee $R/stage_all.txt
pack

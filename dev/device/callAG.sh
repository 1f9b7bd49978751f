#!/usr/bin/env bash
# Call AF found the output warps queueing the next chunk's rows after QH^T slower (exact 3.34 ->
# 3.49 ms, fast 1.77 -> 1.99 at T=32768); back at the top of the chunk, this measures one output
# warp against two per 16 columns again, interleaved, two rounds, with the fused tests.
# run(command="bash .dev/all/callAG.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ag; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run fused_equals 90 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
pack
for round in 1 2; do for P in exact fast; do for w in 1 2; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    DELTANET_FUSED_OUT_WARPS=$w pb "out_warps=$w $P $s" --precision $P --shape $s --repeats 20
  done
done; done; done 2>&1 | tee $R/out_warps.txt
pack

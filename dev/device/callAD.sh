#!/usr/bin/env bash
# For the next session's first call (both host-emulated, not yet run on a GPU):
# 1. the decode kernel with K = V = 128 as compile-time constants (DELTANET_DECODE_CONST=1)
#    against the generic one, interleaved, with the decode tests under it first;
# 2. staging by every warp of the split recurrent kernel (DELTANET_FUSED_STAGE_ALL=1) against
#    the output warps alone, with the K split (exact) and without (fast), fused tests under it.
# run(command="bash .dev/all/callAD.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
R=$OUT/ad; mkdir -p $R
pack() { tar czf $OUT/ad.tgz -C $OUT ad; }
t() { local name=$1; shift; ( timeout 60 env "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "test result|panicked|worst|^rc" $R/$name.txt | tail -3; }
t decode_test_const DELTANET_DECODE_CONST=1 ./decode_test --test-threads=1
t fused_stage_all DELTANET_FUSED_CASES=1 DELTANET_FUSED_STAGE_ALL=1 ./fused_test fused_equals --nocapture
t engine_stage_all DELTANET_FUSED_STAGE_ALL=1 ./engine_test --test-threads=1
pack
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for round in 1 2; do for c in 0 1; do
  for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128"; do
    echo "== round $round const=$c $s"; DELTANET_DECODE_CONST=$c bench --shape $s
  done
done; done 2>&1 | tee $R/decode_const.txt
pack
pb() { local tag=$1; shift; timeout 40 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for round in 1 2; do for P in exact fast; do for a in 0 1; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    DELTANET_FUSED_STAGE_ALL=$a pb "stage_all=$a $P $s" --precision $P --shape $s --repeats 20
  done
done; done; done 2>&1 | tee $R/stage_all.txt
pack

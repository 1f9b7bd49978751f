#!/usr/bin/env bash
# Nsight Compute (call AB) put a third of the split recurrent kernel's stall cycles on
# instruction fetch: its fully unrolled code (~4750 SASS instructions, state and output warps in
# different parts of it at once). This build keeps h_times' loop over K rolled (4048
# instructions, 196 registers, no spills); deltanet_old is the build before, interleaved with it.
# run(command="bash .dev/all/callAJ.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=aj; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run fused_equals 90 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
pack
pbx() { local bin=$1 tag=$2; shift 2; timeout 40 ./$bin bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for round in 1 2; do for P in exact fast; do
  for s in 1,32768,16,32,128,128 1,2048,16,32,128,128 8,8192,16,32,128,128; do
    pbx deltanet_old "old $P $s" --precision $P --shape $s --repeats 20
    pbx deltanet "rolled $P $s" --precision $P --shape $s --repeats 20
  done
done; done 2>&1 | tee $R/rolled.txt
pack

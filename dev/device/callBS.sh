#!/usr/bin/env bash
# The landed build's checks after call BR chose the default (selftest on the vectors,
# fused_equals, the fast test, non-finite rows, engine, racecheck both precisions, memcheck
# varlen), then the time per token from T=16K to 512K, both precisions.
# run(command="bash .dev/all/callBS.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bs; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run selftest 90 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 60 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in exact fast; do
  run race_$P 90 env DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
done
run mem_varlen 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision exact --shape 1,1200,16,32,128,128 --varlen 9
pack
{
for P in exact fast; do
  for T in 16384 131072 524288; do
    timeout 120 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 1 --precision $P --shape 1,$T,16,32,128,128 --repeats 5 --json $R/tok_${P}_$T.json 2>&1 | grep -E "^prefill" | sed "s/^/$P T=$T /"
  done
done
} 2>&1 | tee $R/per_token.txt
pack

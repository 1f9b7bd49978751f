#!/usr/bin/env bash
# chunk_intra's K K^T and Q K^T as warpgroup products (Config::intra_wg, DELTANET_FUSED_INTRAWG):
# A/B first (chunk_intra alone and the forward, both precisions, interleaved; the exact build
# with the diagonals and the doubling forced, which INTRA_WG needs), then the checks with it on
# (fused_equals' tunings include it; non-finite rows, the fast test, selftest, racecheck and
# memcheck), then, with time left, the fast precision's stall samples (callBY.sh).
# run(command="bash .dev/all/callBZ.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bz; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
D="DELTANET_FUSED_INTRADIAG=1 DELTANET_FUSED_DOUBLING=1"
{
for W in 0 1 0 1; do
  env $D DELTANET_FUSED_ONLY=intra DELTANET_FUSED_INTRAWG=$W pb "intra-only wg=$W fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  env $D DELTANET_FUSED_ONLY=intra DELTANET_FUSED_INTRAWG=$W pb "intra-only wg=$W exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
done
DELTANET_FUSED_ONLY=intra pb "intra-only default exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
for P in fast exact; do
  for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128; do
    if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
    for W in 0 1 0 1; do
      env $D DELTANET_FUSED_INTRAWG=$W pb "wg=$W $P $s" --precision $P $a --repeats 20
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
ON="$D DELTANET_FUSED_INTRAWG=1"
run fused_equals 120 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env $ON DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run fast 90 env $ON DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run selftest 120 env $ON ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in exact fast; do
  run race_wg_$P 60 env $ON DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
done
run mem_wg 90 env $ON $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack
[ "${PROFILE:-1}" = 0 ] || TAG=bz_prof bash ./callBY.sh

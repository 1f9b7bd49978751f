#!/usr/bin/env bash
# chunk_intra's two variants (Config::intra_diag: the row norms from the products' diagonals;
# Config::intra_doubling: the inverse below the diagonal by doubling): checked against the stage
# path (fused_equals' tunings include them), with non-finite rows, the fast test, selftest and
# the sanitizers with both on; then A/B DELTANET_FUSED_INTRADIAG / DELTANET_FUSED_DOUBLING in
# both precisions (chunk_intra alone and the forward), interleaved.
# run(command="bash .dev/all/callBV.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bv; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
ON="DELTANET_FUSED_INTRADIAG=1 DELTANET_FUSED_DOUBLING=1"
run fused_equals 90 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env $ON DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run fast 90 env $ON DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run selftest 120 env $ON ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run engine 90 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in exact fast; do
  run race_intra_$P 60 env $ON DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
done
run mem_intra 60 env $ON $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision exact --shape 1,1200,16,32,128,128 --varlen 9
pack
{
for s in 8,8192,16,32,128,128; do
  for V in 00 10 01 11 00 11; do
    DELTANET_FUSED_ONLY=intra DELTANET_FUSED_INTRADIAG=${V:0:1} DELTANET_FUSED_DOUBLING=${V:1:1} pb "intra-only v=$V fast $s" --precision fast --shape $s --repeats 20
  done
done
for P in exact fast; do
  for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
    for V in 00 11 00 11; do
      DELTANET_FUSED_INTRADIAG=${V:0:1} DELTANET_FUSED_DOUBLING=${V:1:1} pb "v=$V $P $s" --precision $P $a --repeats 20
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack

#!/usr/bin/env bash
# The fast precision's P' epilogue made lighter (its exponent without lo, no mask in tiles wholly
# below the diagonal, run while the tensor cores form v_new): A/B of DELTANET_FUSED_PINREC=0|1
# in fast (the recurrent kernel alone and the forward at B=8 and varlen, interleaved), then the
# checks of the fast precision with it on (selftest, the fast test, racecheck, memcheck).
# run(command="bash .dev/all/callCE.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=${TAG:-ce}; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
for W in 0 1 0 1; do
  DELTANET_FUSED_ONLY=recurrent DELTANET_FUSED_PINREC=$W pb "recurrent-only pinrec=$W fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
done
for s in 8,8192,16,32,128,128 varlen; do
  if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
  for W in 0 1 0 1; do
    DELTANET_FUSED_PINREC=$W pb "pinrec=$W fast $s" --precision fast $a --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack
export DELTANET_FUSED_PINREC=1
run selftest_fast 120 ./deltanet selftest --device cuda --precision fast --vectors $TOP/.gpu/vectors
run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_fast 90 env DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision fast --shape 2,300,4,8,128,128
run mem_fast 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack

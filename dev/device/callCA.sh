#!/usr/bin/env bash
# The doubling's products on the tensor cores (Config::intra_doubling_mma,
# DELTANET_FUSED_DOUBLINGMMA): A/B first (chunk_intra alone and the forward, the fast precision's
# default against it with the products on mma; the exact precision with the diagonals and the
# doubling forced, both forms, beside its default), interleaved; then the checks with it on
# (fused_equals' tunings include it; non-finite rows, the fast test, selftest, racecheck in
# both precisions, memcheck).
# run(command="bash .dev/all/callCA.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ca; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
for M in 0 1 0 1; do
  (export DELTANET_FUSED_DOUBLINGMMA=$M DELTANET_FUSED_ONLY=intra
   pb "intra-only mma=$M fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
   export DELTANET_FUSED_INTRADIAG=1 DELTANET_FUSED_DOUBLING=1
   pb "intra-only mma=$M exact(diag,doubling) B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20)
done
DELTANET_FUSED_ONLY=intra pb "intra-only default exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128 1,2048,16,32,128,128; do
  if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
  for M in 0 1 0 1; do
    DELTANET_FUSED_DOUBLINGMMA=$M pb "mma=$M fast $s" --precision fast $a --repeats 20
  done
done
for s in 8,8192,16,32,128,128 varlen; do
  if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
  for V in def 1 def 1; do
    if [ $V = def ]; then
      pb "default exact $s" --precision exact $a --repeats 20
    else
      (export DELTANET_FUSED_INTRADIAG=1 DELTANET_FUSED_DOUBLING=1 DELTANET_FUSED_DOUBLINGMMA=1
       pb "diag,doubling,mma exact $s" --precision exact $a --repeats 20)
    fi
  done
done
} 2>&1 | tee $R/ab.txt
pack
export DELTANET_FUSED_DOUBLINGMMA=1
run fused_equals 120 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run selftest 120 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
run race_fast 60 env DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision fast --shape 2,300,4,8,128,128
run race_exact 60 env DELTANET_FUSED_INTRADIAG=1 DELTANET_FUSED_DOUBLING=1 DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision exact --shape 2,300,4,8,128,128
run mem_fast 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack

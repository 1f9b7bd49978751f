#!/usr/bin/env bash
# The recurrent kernel's staging without row tests for whole chunks, and the non-finite test of v
# on bf16 pairs: A/B of this build (`deltanet`) against the previous one (`deltanet_base`: the
# binary of ac7b0ca, copied into .dev/all after dev/device/stage.sh), interleaved, both
# precisions; the lighter fast P' epilogue (DELTANET_FUSED_PINREC=1, call CE's question) on this
# build; then the checks of this build (selftest both precisions, fused_equals, the fast test,
# non-finite rows, engine, racecheck and memcheck).
# run(command="bash .dev/all/callCF.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=cf; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
DELTANET_FUSED_ONLY=recurrent ab_bins "recurrent-only fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
for P in fast exact; do
  for s in 8,8192,16,32,128,128 varlen 1,32768,16,32,128,128 1,2048,16,32,128,128; do
    [ $P = exact ] && [ $s = 1,2048,16,32,128,128 ] && continue
    ab_bins "$P $s" --precision $P $(shape_args $s) --repeats 20
  done
done
for s in 8,8192,16,32,128,128 varlen; do
  for W in 0 1 0 1; do
    DELTANET_FUSED_PINREC=$W pb "pinrec=$W fast $s" --precision fast $(shape_args $s) --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack
build_checks
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run mem_fast_varlen 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack

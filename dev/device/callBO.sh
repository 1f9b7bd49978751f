#!/usr/bin/env bash
# The warpgroup products (WGMMA, opt-in by DELTANET_FUSED_WGMMA=1) on their first GPU run:
# (1) fused_equals with the new tunings (wgmma at 128 and 64 columns, planes in one buffer,
# segments) and the fast precision's test through the front door with wgmma on; (2) A/B,
# interleaved, wgmma off / on, both precisions, the issue shapes and each kernel alone at B=8;
# (3) engine_test (the captured plan's case now asks for f32 output); (4) racecheck and
# memcheck with wgmma on.
# run(command="bash .dev/all/callBO.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=bo; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run fused_equals 240 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run fast_wgmma 120 env DELTANET_FUSED_WGMMA=1 DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
pack
{
for round in 1 2; do
  for s in 8,8192,16,32,128,128 1,32768,16,32,128,128; do
    for P in exact fast; do
      for W in 0 1; do
        DELTANET_FUSED_WGMMA=$W pb "r$round wg=$W $P $s" --precision $P --shape $s --repeats 20
      done
    done
  done
  for P in exact fast; do
    for W in 0 1; do
      DELTANET_FUSED_WGMMA=$W pb "r$round wg=$W $P varlen64" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
    done
  done
done
for P in exact fast; do
  for W in 0 1; do
    DELTANET_FUSED_ONLY=recurrent DELTANET_FUSED_WGMMA=$W pb "recurrent alone wg=$W $P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  done
done
for W in 0 1; do
  for P in exact fast; do DELTANET_FUSED_WGMMA=$W pb "wg=$W $P T=2048" --precision $P --shape 1,2048,16,32,128,128 --repeats 20; done
done
} 2>&1 | tee $R/ab.txt
pack
run engine 90 ./engine_test --nocapture
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in fast exact; do
  run race_wg_$P 120 env DELTANET_FUSED_WGMMA=1 DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
  run mem_wg_$P 120 env DELTANET_FUSED_WGMMA=1 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 1,1200,16,32,128,128 --varlen 9
done
pack

#!/usr/bin/env bash
# The wgmma build by default (deltanet_base = b879877) against this one: Q H^T left running
# beside v_new (fast) and formed apart just before the output (exact: no spills). (1) Every check
# of a default build (selftest on the vectors, fused_equals, the fast test, non-finite rows,
# engine, racecheck and memcheck); (2) A/B of the two builds, interleaved, both precisions;
# (3) the issue shapes with FLA in the same call; (4) time per token from T=16K to 512K.
# run(command="bash .dev/all/callBP.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bp; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run selftest 90 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 240 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
run non_finite 90 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 90 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in fast exact; do
  run race_$P 120 env DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
done
run mem_varlen 120 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --precision fast --shape 1,1200,16,32,128,128 --varlen 9
pack
{
for round in 1 2; do
  for s in 8,8192,16,32,128,128 1,32768,16,32,128,128; do
    for P in fast exact; do
      for B in deltanet_base deltanet; do
        timeout 40 ./$B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision $P --shape $s --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $B $P $s /"
      done
    done
  done
  for P in fast exact; do
    for B in deltanet_base deltanet; do
      timeout 40 ./$B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $B $P varlen64 /"
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
issue_shapes 2>&1 | tee $R/shapes.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
{
for P in exact fast; do
  for T in 16384 131072 524288; do
    pb "$P T=$T" --precision $P --shape 1,$T,16,32,128,128 --repeats 5
  done
done
} 2>&1 | tee $R/per_token.txt
pack

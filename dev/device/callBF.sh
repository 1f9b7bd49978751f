#!/usr/bin/env bash
# Fifteenth stop: the two parked kernel changes measured. (1) Interleaved A/B, two rounds:
# ./deltanet_base (ff8847c), this build with one value head per chunk_intra block
# (DELTANET_FUSED_HPB=1: only the recurrent kernel's one split of h for K h^T and Q h^T), and
# this build by default (two value heads per chunk_intra block where HV = 2H as well); each
# kernel alone at B=8. (2) The issue shapes of this build with FLA beside. (3) Checks of this
# build, sanitizers on the selftest and on HV = 2H problems (two heads a block) in bf16 and f32.
# run(command="bash .dev/all/callBF.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bf; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
pbx() { local bin=$1 tag=$2; shift 2; timeout 40 $bin bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
B8="--shape 8,8192,16,32,128,128"; T32="--shape 1,32768,16,32,128,128"; VL="--shape 1,65536,16,32,128,128 --varlen 64"
{
for round in 1 2; do
  for v in base hpb1 new; do
    B=./deltanet; E=""; [ $v = base ] && B=./deltanet_base; [ $v = hpb1 ] && E="DELTANET_FUSED_HPB=1"
    for s in B8 T32 VL; do
      env $E $B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact ${!s} --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $v exact $s /"
    done
    env $E DELTANET_FUSED_ONLY=intra $B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact $B8 --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $v intra-only exact B8 /"
    env $E DELTANET_FUSED_ONLY=recurrent $B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact $B8 --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $v recurrent-only exact B8 /"
    env $E $B bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision fast $B8 --repeats 20 2>&1 | grep -E "^prefill" | sed "s/^/r$round $v fast B8 /"
  done
done
} 2>&1 | tee $R/ab.txt
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 60 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
for d in bf16 f32; do
  run racecheck_hpb2_$d 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype $d --shape 2,300,2,4,128,128 --warmup 0 --repeats 1
  run memcheck_hpb2_$d 60 $CS --tool memcheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype $d --shape 1,1000,2,4,128,128 --varlen 3 --warmup 0 --repeats 1
done
pack

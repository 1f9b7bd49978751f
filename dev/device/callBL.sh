#!/usr/bin/env bash
# Sixteenth stop, third call. Call BK: persistent blocks made no difference and their build
# was 7 % slower on whole chunks (reverted: this build's kernels without the row skip are the
# base's, SASS identical). The row skip (a second build of the products for short chunks) is
# now the default where 2 % or more of the chunks are short (varlen 64: 6 %); whole-chunk
# problems keep the base build. (1) A/B, interleaved: ./deltanet_base (c8dad45) against this
# build with the row skip off and on: varlen exact and fast, B=8 exact with the skip forced on;
# FLA varlen beside. (2) Sanitizers over the skip, the checks. (3) The issue shapes with FLA.
# run(command="bash .dev/all/callBL.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bl; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
V="--shape 1,65536,16,32,128,128 --varlen 64"
{
for round in 1 2 3; do
  for b in base skip0 skip1; do
    case $b in base) X="./deltanet_base"; E="";; skip0) X="./deltanet"; E="DELTANET_FUSED_ROWSKIP=0";; skip1) X="./deltanet"; E="DELTANET_FUSED_ROWSKIP=1";; esac
    for P in exact fast; do
      env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision $P --repeats 30 $V 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b $P varlen64 /"
    done
  done
  DELTANET_FUSED_ROWSKIP=1 pb "r$round skip1 exact B8" --precision exact --shape 8,8192,16,32,128,128 --repeats 30
  pb "r$round default exact B8" --precision exact --shape 8,8192,16,32,128,128 --repeats 30
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "" --varlen "64,65536,16,32,128,128" 2>&1 | tail -1 | sed "s/^/r$round /"
  pack
done
} 2>&1 | tee $R/ab.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
run race_skip 90 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run mem_skip 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run race_skip128 90 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,1200,16,32,128,128 --varlen 9
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 60 ./engine_test --nocapture
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

#!/usr/bin/env bash
# Fifteenth stop, second call: the build that lands (the recurrent kernel's one split of h; one
# value head per chunk_intra block, as before). (1) Where call BF's racecheck hazards come from:
# racecheck with source lines (DELTANET_NVRTC_LINEINFO=1) on the B=2 T=300 H=2 HV=4 bf16
# problem (split kernel, K split, 16 columns) for this build and for ./deltanet_base (ff8847c),
# then with the K split off and with the split off. (2) Varlen with segments forced (does the
# tail of the longest sequences cost?). (3) The issue shapes with FLA beside; the checks.
# run(command="bash .dev/all/callBG.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bg; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --shape 2,300,2,4,128,128 --warmup 0 --repeats 1"
export DELTANET_NVRTC_LINEINFO=1
run race_new 60 $CS --tool racecheck --error-exitcode 9 --print-limit 20 ./deltanet bench $SH
run race_base 60 $CS --tool racecheck --error-exitcode 9 --print-limit 20 ./deltanet_base bench $SH
run race_noksplit 60 env DELTANET_FUSED_KSPLIT=0 $CS --tool racecheck --error-exitcode 9 --print-limit 20 ./deltanet bench $SH
run race_nosplit 60 env DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 --print-limit 20 ./deltanet bench $SH
run race_fast 60 $CS --tool racecheck --error-exitcode 9 --print-limit 20 ./deltanet bench $SH --precision fast
unset DELTANET_NVRTC_LINEINFO
pack
{
for S in 0 2 4; do
  DELTANET_FUSED_SEGMENTS=$S pb "segments=$S exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
done
} 2>&1 | tee $R/segments.txt
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
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run race_plain128 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 4,128,16,32,128,128 --warmup 0 --repeats 1
pack

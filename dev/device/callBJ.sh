#!/usr/bin/env bash
# Sixteenth stop, first call: partial chunks skip their empty 16-row blocks in the recurrent
# kernel's products; blocks over whole sequences persistent (as many as fit, items from a
# counter), each staging its next item's first chunk during the current item's last.
# (1) compute-sanitizer on the new paths (few blocks: several items each, partial chunks);
# (2) A/B, interleaved rounds: ./deltanet_base (c8dad45), this build, this build with
# DELTANET_FUSED_PERSIST=0 (the row skip alone), varlen 64 and B=8 exact, FLA beside;
# (3) the checks; (4) the issue shapes in both precisions with FLA beside.
# run(command="bash .dev/all/callBJ.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bj; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
run race_varlen 90 env DELTANET_FUSED_BLOCKS=3 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run mem_varlen 90 env DELTANET_FUSED_BLOCKS=3 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run race_plain128 90 env DELTANET_FUSED_BLOCKS=16 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 4,300,16,32,128,128
run mem_plain128 90 env DELTANET_FUSED_BLOCKS=16 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --shape 4,300,16,32,128,128
run race_default 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 2,300,2,4,128,128
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
{
for round in 1 2 3; do
  for b in base new new0; do
    case $b in base) X="./deltanet_base"; E="";; new) X="./deltanet"; E="";; new0) X="./deltanet"; E="DELTANET_FUSED_PERSIST=0";; esac
    for s in "varlen64 --shape 1,65536,16,32,128,128 --varlen 64" "B8 --shape 8,8192,16,32,128,128"; do
      set -- $s; lab=$1; shift
      env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact --repeats 30 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b exact $lab /"
    done
  done
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "8,8192,16,32,128,128" --varlen "64,65536,16,32,128,128" 2>&1 | tail -2 | sed "s/^/r$round /"
  pack
done
} 2>&1 | tee $R/ab.txt
pack
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 60 ./engine_test --nocapture
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

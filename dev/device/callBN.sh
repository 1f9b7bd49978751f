#!/usr/bin/env bash
# For the next stop's first call (written at the end of the sixteenth stop, whose device time ran
# out): the checks this stop's last build has not had on a GPU, then the issue shapes with FLA.
# (1) engine_test, whose new test captures a plan's first forward (Plan::new now loads the fused
# kernels); (2) fused_equals with every tuning (new: blocks running several items over the plain
# kernel with LATE_PLANES and the split one with one buffer; the row skip off, and on in the
# split kernel over segments); (3) sanitizers over a varlen problem (the row skip's peeled
# step) and over selftest; (4) the issue shapes in both precisions with FLA beside, and varlen
# with the row skip off and on, interleaved.
# run(command="bash .dev/all/callBN.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bn; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run engine 90 ./engine_test --nocapture
run fused_equals 200 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
run race_skip 90 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,1200,16,32,128,128 --varlen 9
run mem_skip 90 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --shape 1,1200,16,32,128,128 --varlen 9
run race_split_skip 90 env DELTANET_FUSED_ROWSKIP=1 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
{
for round in 1 2; do
  for S in 0 1; do
    for P in exact fast; do
      DELTANET_FUSED_ROWSKIP=$S pb "r$round skip=$S $P varlen64" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 30
    done
  done
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "" --varlen "64,65536,16,32,128,128" 2>&1 | tail -1 | sed "s/^/r$round /"
done
} 2>&1 | tee $R/varlen.txt
pack
issue_shapes 2>&1 | tee $R/shapes.txt
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

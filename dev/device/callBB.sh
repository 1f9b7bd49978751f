#!/usr/bin/env bash
# Twelfth stop, second call: the exact 128-column kernel with its planes in one stage buffer and
# the other rows in two (LATE_PLANES, the default where two whole buffers do not fit) against one
# stage buffer (DELTANET_FUSED_LATE=0), interleaved; checks of the build; FLA beside.
# run(command="bash .dev/all/callBB.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bb; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
for round in 1 2; do
  for L in 0 1; do
    DELTANET_FUSED_LATE=$L pb "r$round late=$L exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
    DELTANET_FUSED_LATE=$L DELTANET_FUSED_ONLY=recurrent pb "r$round late=$L exact B=8 recurrent-only" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
    DELTANET_FUSED_LATE=$L pb "r$round late=$L exact T=32768" --precision exact --shape 1,32768,16,32,128,128 --repeats 20
    DELTANET_FUSED_LATE=$L pb "r$round late=$L exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 240 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=4 ./fused_test fused_keeps_non_finite --nocapture
run engine 120 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck_late 90 env DELTANET_FUSED_SPLIT=0 DELTANET_FUSED_LATE=1 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck_late 90 env DELTANET_FUSED_SPLIT=0 DELTANET_FUSED_LATE=1 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck_late_seg 90 env DELTANET_FUSED_SPLIT=0 DELTANET_FUSED_LATE=1 DELTANET_FUSED_SEGMENTS=3 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

#!/usr/bin/env bash
# Thirteenth stop: (1) the a_inv and p planes' blocks above the diagonal neither written by
# chunk_intra nor staged by the recurrent kernel (this build, ./deltanet) against the build
# before it (./deltanet_base, 9ee3577), each with LATE_PLANES off and on (DELTANET_FUSED_LATE),
# interleaved, two rounds; (2) checks of this build (the fused tests now start from a NaN
# workspace), sanitizers with LATE_PLANES forced and by default; (3) the issue shapes with the
# faster LATE setting of (1), FLA beside.
# run(command="bash .dev/all/callBC.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bc; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
# pbx BINARY LABEL ARGS...: pb with another binary.
pbx() { local bin=$1 tag=$2; shift 2; timeout 40 $bin bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
{
for round in 1 2; do
  for bin in base new; do
    B=./deltanet; [ $bin = base ] && B=./deltanet_base
    for L in 0 1; do
      DELTANET_FUSED_LATE=$L pbx $B "r$round $bin late=$L exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
      DELTANET_FUSED_LATE=$L pbx $B "r$round $bin late=$L exact T=32768" --precision exact --shape 1,32768,16,32,128,128 --repeats 20
    done
    DELTANET_FUSED_ONLY=intra pbx $B "r$round $bin intra-only exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
    DELTANET_FUSED_ONLY=recurrent DELTANET_FUSED_LATE=1 pbx $B "r$round $bin late=1 recurrent-only exact B=8" --precision exact --shape 8,8192,16,32,128,128 --repeats 20
    pbx $B "r$round $bin fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
    pbx $B "r$round $bin fast T=32768" --precision fast --shape 1,32768,16,32,128,128 --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack
# The faster LATE setting of this build at B=8 (sum of both rounds' medians).
med() { grep "$1" $R/ab.txt | awk '{for (i = 1; i < NF; ++i) if ($i == "prefill") s += $(i + 1)} END {print s + 0}'; }
l0=$(med "new late=0 exact B=8"); l1=$(med "new late=1 exact B=8")
LATE=0; awk -v a=$l0 -v b=$l1 'BEGIN {exit !(b > 0 && b < a)}' && LATE=1
echo "late=0 $l0  late=1 $l1  -> LATE=$LATE" | tee $R/late.txt
export DELTANET_FUSED_LATE=$LATE
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 240 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=4 ./fused_test fused_keeps_non_finite --nocapture
run engine 120 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck_late_seg 90 env DELTANET_FUSED_SPLIT=0 DELTANET_FUSED_LATE=1 DELTANET_FUSED_SEGMENTS=3 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck_late 90 env DELTANET_FUSED_SPLIT=0 DELTANET_FUSED_LATE=1 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

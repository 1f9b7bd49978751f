#!/usr/bin/env bash
# The final build of the tenth stop (segments inside the card, the second stream at the highest
# priority): vectors, random problems, sanitizers with the default tuning, the issue's shapes in
# both precisions with FLA beside, time per token from T=16K to 512K, half and all value heads
# slow; one call.
# run(command="bash .dev/all/callAZ.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=az; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 200 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=4 ./fused_test fused_keeps_non_finite --nocapture
run engine 120 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
{
for P in exact fast; do
  for T in 16384 32768 65536 131072 262144 524288; do
    pb "$P T=$T" --precision $P --shape 1,$T,16,32,128,128 --repeats 10 --json $R/tpt_${P}_$T.json
  done
done
for round in 1 2 3; do
  for sh in 0.5 1; do
    for P in exact fast; do
      pb "r$round slow=$sh $P" --precision $P --shape 1,32768,16,32,128,128 --slow-heads $sh --repeats 30
    done
  done
done
} 2>&1 | tee $R/tpt.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

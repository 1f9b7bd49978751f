#!/usr/bin/env bash
# The final build of the tenth stop (segments inside the card, the second stream at the highest
# priority), first of two calls: vectors, random problems, sanitizers with the default tuning,
# time per token from T=16K to 512K, half and all value heads slow (callAZ2.sh: the issue's
# shapes with FLA beside).
# run(command="bash .dev/all/callAZ1.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=az1; R=$OUT/$TAG; mkdir -p $R
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

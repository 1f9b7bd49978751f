#!/usr/bin/env bash
# Segments inside the card, second build (tenth stop; part 2 on a second stream beside part 1, non-finite v handed on by part 3 instead of checked in chunk_intra, fast segments only where 4x wider): chunk_recurrent_regs in segments with warm-ups (part 1)
# and the value heads that cannot be cut over whole sequences (part 2). Checks with segments
# forced (DELTANET_FUSED_SEGMENTS=3: every supported problem, segments of one chunk and up),
# then A/B timing in the same binary: DELTANET_FUSED_SEGMENTS=0 (the previous behaviour) against
# the automatic choice, both precisions, B=1 T=2048..65536 and B=2; slow gates on half and on
# all value heads; each kernel alone at T=32768.
# run(command="bash .dev/all/callAW.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=aw; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run selftest_seg 60 env DELTANET_FUSED_SEGMENTS=3 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 200 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run non_finite_seg 90 env DELTANET_FUSED_CASES=4 DELTANET_FUSED_SEGMENTS=3 ./fused_test fused_keeps_non_finite --nocapture
run engine 120 ./engine_test --nocapture
run engine_seg 120 env DELTANET_FUSED_SEGMENTS=3 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck_seg 90 env DELTANET_FUSED_SEGMENTS=3 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck_seg 90 env DELTANET_FUSED_SEGMENTS=3 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
{
for s in 1,32768 1,65536 1,8192 1,4096 1,2048 2,16384; do
  for P in exact fast; do
    for SEG in 0 auto; do
      if [ $SEG = auto ]; then E=""; else E="DELTANET_FUSED_SEGMENTS=0"; fi
      env $E bash -c ". ./lib.sh; pb 'seg=$SEG $P $s' --precision $P --shape $s,16,32,128,128 --repeats 20"
    done
  done
done
for sh in 0.5 1; do
  for P in exact fast; do
    for SEG in 0 auto; do
      if [ $SEG = auto ]; then E=""; else E="DELTANET_FUSED_SEGMENTS=0"; fi
      env $E bash -c ". ./lib.sh; pb 'slow=$sh seg=$SEG $P' --precision $P --shape 1,32768,16,32,128,128 --slow-heads $sh --repeats 20"
    done
  done
done
for P in exact fast; do
  for ONLY in intra recurrent; do
    DELTANET_FUSED_ONLY=$ONLY pb "only=$ONLY seg=auto $P" --precision $P --shape 1,32768,16,32,128,128 --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack

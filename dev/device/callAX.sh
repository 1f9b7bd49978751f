#!/usr/bin/env bash
# Segments with half the value heads slow (tenth stop): which launch goes first (part 2, the
# whole-sequence heads, on the second stream, or part 1), three rounds; a quarter and an eighth
# of the heads slow.
# run(command="bash .dev/all/callAX.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ax; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
{
for round in 1 2 3; do
  for P in exact fast; do
    for F in 0 1; do
      DELTANET_FUSED_PART2_FIRST=$F pb "r$round slow=0.5 part2first=$F $P" --precision $P --shape 1,32768,16,32,128,128 --slow-heads 0.5 --repeats 30
    done
  done
done
for sh in 0.25 0.125; do
  for P in exact fast; do
    DELTANET_FUSED_SEGMENTS=0 pb "slow=$sh seg=0 $P" --precision $P --shape 1,32768,16,32,128,128 --slow-heads $sh --repeats 30
    for F in 0 1; do
      DELTANET_FUSED_PART2_FIRST=$F pb "slow=$sh part2first=$F $P" --precision $P --shape 1,32768,16,32,128,128 --slow-heads $sh --repeats 30
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack

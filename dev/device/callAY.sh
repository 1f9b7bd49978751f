#!/usr/bin/env bash
# Half the value heads slow, segments on (tenth stop): the second stream at the highest priority
# or not, part 2 launched first or not; three rounds.
# run(command="bash .dev/all/callAY.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ay; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
{
for round in 1 2 3; do
  for P in exact fast; do
    for PR in 0 1; do
      for F in 0 1; do
        DELTANET_SIDE_PRIORITY=$PR DELTANET_FUSED_PART2_FIRST=$F pb "r$round slow=0.5 prio=$PR part2first=$F $P" --precision $P --shape 1,32768,16,32,128,128 --slow-heads 0.5 --repeats 30
      done
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack

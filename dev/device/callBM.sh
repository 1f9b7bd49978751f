#!/usr/bin/env bash
# Sixteenth stop, fourth call (what is left of the device time). The row skip with the short
# chunk (always an item's last) peeled off the chunk loop: one generic lambda holds the chunk
# step, the loop runs it for whole chunks, a second copy after the loop for a short one. A/B,
# interleaved: ./deltanet_base (c8dad45), this build with the skip off and on (default on for
# varlen). Then racecheck over the skip and fused_equals (one case).
# run(command="bash .dev/all/callBM.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=bm; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
V="--shape 1,65536,16,32,128,128 --varlen 64"
{
for round in 1 2; do
  for b in base skip0 skip1; do
    case $b in base) X="./deltanet_base"; E="";; skip0) X="./deltanet"; E="DELTANET_FUSED_ROWSKIP=0";; skip1) X="./deltanet"; E="DELTANET_FUSED_ROWSKIP=1";; esac
    for P in exact fast; do
      env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision $P --repeats 30 $V 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b $P varlen64 /"
    done
    env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact --repeats 30 --shape 8,8192,16,32,128,128 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b exact B8 /"
  done
  pack
done
} 2>&1 | tee $R/ab.txt
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_skip 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --shape 1,1200,16,32,128,128 --varlen 9
run fused_equals 100 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
pack

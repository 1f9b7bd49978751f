#!/usr/bin/env bash
# Fifteenth stop, third call (this build: the K split off by default): (1) what the exact split
# kernel's K split (the configuration racecheck flags in calls BF and BG) was worth where it ran
# by default (one or two short sequences), on against off, interleaved; racecheck of the default
# on call BG's problem; (2) varlen beside FLA in two interleaved rounds (call BG: 3.715
# against 3.690 ms, one round each).
# run(command="bash .dev/all/callBH.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bh; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
for round in 1; do
  for KS in 1 0; do
    for s in 1,2048,16,32,128,128 1,4096,16,32,128,128 2,4096,16,32,128,128 1,8192,16,32,128,128; do
      DELTANET_FUSED_KSPLIT=$KS pb "r$round ksplit=$KS exact $s" --precision exact --shape $s --repeats 30
    done
  done
done
} 2>&1 | tee $R/ksplit.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_default 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 2,300,2,4,128,128 --warmup 0 --repeats 1
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
for round in 1 2; do
  pb "r$round exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 30
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "" --varlen "64,65536,16,32,128,128" 2>&1 | tail -1 | sed "s/^/r$round /"
done 2>&1 | tee $R/varlen.txt
pack

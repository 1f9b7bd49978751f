#!/usr/bin/env bash
# Fifteenth stop, last call (what is left of call BH within the device time left): racecheck of
# the default (K split off) on call BG's problem, then varlen beside FLA, two interleaved rounds;
# last, fused_equals (one case) with the new few-blocks tunings.
# run(command="bash .dev/all/callBI.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bi; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_default 60 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 2,300,2,4,128,128 --warmup 0 --repeats 1
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
for round in 1 2; do
  pb "r$round exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 30
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "" --varlen "64,65536,16,32,128,128" 2>&1 | tail -1 | sed "s/^/r$round /"
  pack
done 2>&1 | tee $R/varlen.txt
pack
run fused_equals 100 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
pack

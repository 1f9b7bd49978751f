#!/usr/bin/env bash
# Issue 10's N=1 bar (0.010 ms) read to more than three decimals: the decode bench's JSON
# medians, five rounds of N=1 with N=256 between them (the default kernels of call AE).
# run(command="bash .dev/all/callAI.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=ai; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
for round in 1 2 3 4 5; do
  for s in 1,1,16,32,128,128 256,1,16,32,128,128; do
    ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 --shape $s --json $R/r${round}_${s%%,*}.json > /dev/null 2>&1
  done
done
python3 - "$R" <<'PY' | tee $R/medians.txt
import json, sys, glob, statistics
for f in sorted(glob.glob(sys.argv[1] + "/r*.json")):
    for r in json.load(open(f))["results"]:
        t = sorted(r["times_ms"])
        print(f.split("/")[-1], r["work"], "median %.5f ms" % t[len(t) // 2], "min %.5f" % t[0])
PY
pack

#!/usr/bin/env bash
# The decode kernel as landed: large launches against the oracle, bench beside FLA.
cd "$(dirname "$0")"
(time timeout 60 ./decode_test gpu_large gpu_pool --test-threads=2 --nocapture) > $OUT/dt.txt 2>&1; grep -E "pool cases|test result" $OUT/dt.txt
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 20 --repeats 100 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128"; do echo "== $s"; bench --shape $s; done
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 60 python3 .gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128;64,32,16,128,128" --json $OUT/fla.json 2>&1 | tail -3

#!/usr/bin/env bash
# One device call: correctness (non-finite, engine, fused random cases), sanitizers, prefill timings beside FLA.
cd "$(dirname "$0")"
export PATH=/usr/local/cuda/bin:$PATH
V=../vectors
S='1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -4 $OUT/$name.txt; }
run memcheck 100 compute-sanitizer --tool memcheck --error-exitcode 9 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite
run time_auto 100 env DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
run time_vt16 100 env DELTANET_FUSED_VT=16 DELTANET_FUSED_WIDE=0 DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
python3 -m pip install -q --no-index --no-deps --target /tmp/site ../../.gpu/fla/*.whl > /dev/null 2>&1
run fla 150 env PYTHONPATH=/tmp/site python3 ../../.gpu/anchors.py --impl fla --shapes "$S" --varlen '64,65536,16,32,128,128' --json $OUT/fla.json
run varlen 60 ./deltanet bench --device cuda --shape 1,65536,16,32,128,128 --varlen 64 --dtype bf16 --work prefill --repeats 20
grep -h "median\|fla\|ERROR\|rc=" $OUT/*.txt | head -60

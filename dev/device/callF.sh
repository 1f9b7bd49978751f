#!/usr/bin/env bash
# One call: the register-resident recurrent kernel (chunk_recurrent_regs): correctness against
# the stage path, float64 and the shared-memory kernel, non-finite inputs, engine and decode
# tests (the Step refactor), timings of every variant beside FLA, sanitizers last.
cd "$(dirname "$0")"
export PATH=/usr/local/cuda/bin:$PATH
S='1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -3 $OUT/$name.txt; }
run time_auto 60 env DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
run fused 150 env DELTANET_FUSED_CASES=5 ./fused_test fused_equals --nocapture
run time_fast1 40 env DELTANET_FUSED_PIECES=1 DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
run time_fast2 40 env DELTANET_FUSED_PIECES=2 DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture

run fast 90 env DELTANET_FUSED_CASES=20 ./fused_test fused_fast --nocapture
run time_old 60 env DELTANET_FUSED_REGS=0 DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
run nonfinite 40 env DELTANET_FUSED_CASES=12 ./fused_test fused_keeps_non_finite --nocapture
run engine 40 ./engine_test --test-threads=1
run decode_tests 60 ./decode_test --test-threads=4
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 60 python3 .gpu/anchors.py --impl fla --shapes "$S" --json $OUT/fla.json > $OUT/fla.txt 2>&1
tail -5 $OUT/fla.txt
grep -h -E "test result|poisoned|worst|median|panicked" $OUT/*.txt

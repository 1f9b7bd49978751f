#!/usr/bin/env bash
# One device call: correctness (non-finite, engine, fused random cases), sanitizers, prefill timings beside FLA.
cd "$(dirname "$0")"
export PATH=/usr/local/cuda/bin:$PATH
V=../vectors
S='1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -4 $OUT/$name.txt; }
run nonfinite 90 ./fused_test fused_keeps_non_finite --nocapture
run engine 110 ./engine_test --test-threads=1
run fused 150 env DELTANET_FUSED_CASES=12 ./fused_test fused_equals --nocapture
run racecheck 100 compute-sanitizer --tool racecheck --error-exitcode 9 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals
run racecheck_nf 100 compute-sanitizer --tool racecheck --error-exitcode 9 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite
grep -h "passed\|failed\|poisoned\|worst\|ERROR\|rc=\|panicked" $OUT/*.txt | head -60

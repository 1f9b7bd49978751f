#!/usr/bin/env bash
# One call: decode (tests incl. persistent launches, bench with/without prefetch, FLA), fused
# (correctness with the integer TF32 rounding, timings beside FLA), sanitizers last.
cd "$(dirname "$0")"
export PATH=/usr/local/cuda/bin:$PATH
S='1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -2 $OUT/$name.txt; }
run decode_tests 60 ./decode_test --test-threads=4 --nocapture
run fused 80 env DELTANET_FUSED_CASES=8 ./fused_test fused_equals --nocapture
run nonfinite 40 env DELTANET_FUSED_CASES=16 ./fused_test fused_keeps_non_finite --nocapture
run engine 40 ./engine_test --test-threads=1
run time_auto 60 env DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 20 --repeats 100 "$@" 2>&1; }
for pf in 1 0; do
export DELTANET_DECODE_PREFETCH=$pf
{
echo "== prefetch=$pf N=256";      bench --shape 256,1,16,32,128,128
echo "== prefetch=$pf N=256 pool 1024"; bench --shape 256,1,16,32,128,128 --pool 1024
echo "== prefetch=$pf N=64";       bench --shape 64,1,16,32,128,128
echo "== prefetch=$pf N=64 T=4";   bench --shape 64,1,16,32,128,128 --tokens 4
echo "== prefetch=$pf N=1";        bench --shape 1,1,16,32,128,128
echo "== prefetch=$pf N=256 v_first";   bench --shape 256,1,16,32,128,128 --state-v-first
} > $OUT/bench_pf$pf.txt
done
unset DELTANET_DECODE_PREFETCH
grep -h -E "==|^decode|^d2d" $OUT/bench_pf*.txt
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 100 python3 .gpu/anchors.py --impl fla --shapes "$S" --decode "1,32,16,128,128;256,32,16,128,128" --json $OUT/fla.json > $OUT/fla.txt 2>&1
tail -7 $OUT/fla.txt
cd .dev/all
run dmemcheck 45 compute-sanitizer --tool memcheck --error-exitcode 9 ./decode_test gpu_persistent --test-threads=1 --nocapture
run dracecheck 45 compute-sanitizer --tool racecheck --error-exitcode 9 ./decode_test gpu_persistent --test-threads=1 --nocapture
run fmemcheck 50 compute-sanitizer --tool memcheck --error-exitcode 9 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite --nocapture
grep -h -E "test result|ERROR SUMMARY|RACECHECK SUMMARY|poisoned|worst|pool cases|median" $OUT/*.txt

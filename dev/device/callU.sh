#!/usr/bin/env bash
# 1. The split chunk_recurrent_regs (an output warp beside each state warp; issue 8): the fused
#    tests with it among the tunings, its time beside the other kernels and FLA.
# 2. Decode (issue 10): the oracle tests, the issue's shapes, FLA beside.
# 3. Selftest on the GPU (random problems and the vector files), compute-sanitizer.
# 4. The prefill sweep for the plot (issue 9), exact and fast, FLA beside.
# run(command="bash .dev/all/callU.sh", carry=[".dev/all", ".gpu"]). About 8 min.
# Everything lands in one archive, $OUT/u.tgz, rewritten after each part (a call returns at
# most 8 files, and a cut call still returns what is there).
cd "$(dirname "$0")"
R=$OUT/u; mkdir -p $R
pack() { tar czf $OUT/u.tgz -C $OUT u; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked" $R/$name.txt | tail -6; }
S='1,32768,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run fused_equals 90 env DELTANET_FUSED_CASES=4 ./fused_test fused_equals --nocapture
run split32 80 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_SPLIT=1 DELTANET_FUSED_TIME="$S" ./fused_test --ignored fused_time --nocapture
run split16 60 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_SPLIT=1 DELTANET_FUSED_VT=16 DELTANET_FUSED_NBUF=1 DELTANET_FUSED_TIME="1,32768,16,32,128,128" ./fused_test --ignored fused_time --nocapture
run regs 60 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_TIME="1,32768,16,32,128,128" ./fused_test --ignored fused_time --nocapture
run split_fast 60 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_SPLIT=1 DELTANET_FUSED_PIECES=1 DELTANET_FUSED_TIME="1,32768,16,32,128,128" ./fused_test --ignored fused_time --nocapture
pack
# 2. Decode.
run decode_test 70 ./decode_test --test-threads=4 --nocapture
bench() { timeout 30 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 400 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128" "256,1,16,32,128,128 --state-v-first"; do echo "== $s"; bench --shape $s; done 2>&1 | tee $R/decode_bench.txt
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 60 python3 .gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128;64,32,16,128,128" --json $R/fla_decode.json 2>&1 | tail -4
cd .dev/all
pack
# 3. Selftest, sanitizers.
run selftest 100 ./deltanet selftest --device cuda --vectors ../../.gpu/vectors
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck_decode 50 $CS --tool racecheck --error-exitcode 9 ./decode_test gpu_multi --test-threads=1
run racecheck_split 60 $CS --tool racecheck --error-exitcode 9 env DELTANET_FUSED_CASES=2 DELTANET_FUSED_REGS=1 DELTANET_FUSED_SPLIT=1 ./fused_test fused_keeps_non_finite
pack
# 4. The sweep (B=1, bf16, H=16 HV=32 K=V=128): JSON for `deltanet plot`.
for T in 2048 8192 32768 131072 524288; do
  for P in exact fast; do
    reps=20; [ $T -ge 131072 ] && reps=5
    timeout 60 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,$T,16,32,128,128 --precision $P --warmup 2 --repeats $reps --json $R/sweep_${P}_$T.json 2>&1 | grep -E "^prefill" | sed "s/^/$P T=$T /"
  done
done 2>&1 | tee $R/sweep.txt
pack
cd ../..
timeout 120 python3 .gpu/anchors.py --impl fla --shapes "1,2048,16,32,128,128;1,8192,16,32,128,128;1,32768,16,32,128,128;1,131072,16,32,128,128;1,524288,16,32,128,128" --json $R/fla_sweep.json 2>&1 | tail -7
pack

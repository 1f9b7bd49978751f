#!/usr/bin/env bash
# For the next session's first call (host-emulated, not yet run on a GPU): chunk_intra with A_strict
# and A_inv in the memory of the staged rows (four blocks per SM) and a branch-free cumsum;
# correctness first (fused tests, non-finite rows, engine tests, racecheck and memcheck over
# fused runs), then the issue shapes (prefill, exact and fast, through the engine API) and the
# decode shapes, then the sweep for the plot. FLA and FlashQLA: calls V and W (same day).
# FLA (decode and the prefill shapes) in the same call, for the issues' one-run bars.
# run(command="bash .dev/all/callY.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
R=$OUT/y; mkdir -p $R
pack() { tar czf $OUT/y.tgz -C $OUT y; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked|poisoned" $R/$name.txt | tail -5; }
run fused_equals 60 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 40 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine_test 40 ./engine_test --test-threads=1
pack
pb() { local tag=$1; shift; timeout 40 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for P in exact fast; do
  for s in 1,32768,16,32,128,128 1,65536,16,32,128,128 8,8192,16,32,128,128 1,2048,16,32,128,128; do
    pb "$P $s" --precision $P --shape $s --repeats 20 --json $R/shape_${P}_${s//,/_}.json
  done
  pb "$P varlen64 1,65536" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 --json $R/shape_${P}_varlen64.json
done 2>&1 | tee $R/shapes.txt
DELTANET_FUSED_ONLY=intra pb "intra-only exact 1,32768" --shape 1,32768,16,32,128,128 --repeats 20 | tee $R/intra.txt
# The opt-in K split of the split recurrent kernel (two state warps per 16 columns).
for P in exact fast; do for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
  DELTANET_FUSED_KSPLIT=1 pb "ksplit $P $s" --precision $P --shape $s --repeats 20
done; done 2>&1 | tee $R/ksplit.txt
run ksplit_equals 60 env DELTANET_FUSED_CASES=2 DELTANET_FUSED_REGS=1 DELTANET_FUSED_SPLIT=1 DELTANET_FUSED_KSPLIT=1 ./fused_test fused_equals --nocapture
pack
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 300 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128"; do echo "== $s"; bench --shape $s; done 2>&1 | tee $R/decode_bench.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 60 python3 $TOP/.gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128;64,32,16,128,128" --json $R/fla_decode.json 2>&1 | tail -4
for s in "256,1,16,32,128,128" "1,1,16,32,128,128"; do echo "== again $s"; bench --shape $s; done 2>&1 | tee -a $R/decode_bench.txt
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 50 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 50 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
for T in 8192 131072; do for P in exact fast; do
  pb "$P T=$T" --precision $P --shape 1,$T,16,32,128,128 --repeats 10 --json $R/sweep_${P}_$T.json
done; done 2>&1 | tee $R/sweep.txt
pack

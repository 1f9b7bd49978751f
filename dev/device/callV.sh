#!/usr/bin/env bash
# The split recurrent kernel (default now for bf16 where blocks would be narrower than 128
# columns) with the update's accumulators interleaved: correctness, the issue shapes through the
# engine API (`deltanet bench`), FLA beside; chunk_intra's share; decode N=256 again; the sweep
# for the plot. Also installs FlashQLA's wheels into /tmp/site for callW.sh right after.
# run(command="bash .dev/all/callV.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/qla"])
cd "$(dirname "$0")"
R=$OUT/v; mkdir -p $R
pack() { tar czf $OUT/v.tgz -C $OUT v; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked" $R/$name.txt | tail -6; }
( python3 -m pip install -q --no-index --no-deps --target /tmp/site ../../.gpu/fla/*.whl ../../.gpu/qla/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?" >> $R/pip.txt ) &
run fused_equals 90 env DELTANET_FUSED_CASES=4 ./fused_test fused_equals --nocapture
pack
pb() { local tag=$1; shift; timeout 60 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for P in exact fast; do
  for s in 1,32768,16,32,128,128 1,65536,16,32,128,128 8,8192,16,32,128,128 1,2048,16,32,128,128; do
    pb "$P $s" --precision $P --shape $s --repeats 20 --json $R/shape_${P}_${s//,/_}.json
  done
  pb "$P varlen64 1,65536" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 --json $R/shape_${P}_varlen64.json
done 2>&1 | tee $R/shapes.txt
for s in 1,32768,16,32,128,128 8,8192,16,32,128,128; do
  DELTANET_FUSED_ONLY=intra pb "intra-only exact $s" --shape $s --repeats 20
done 2>&1 | tee $R/intra.txt
pack
wait
export PYTHONPATH=/tmp/site
cd ../..
timeout 100 python3 .gpu/anchors.py --impl fla --shapes "1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6
cd .dev/all
pack
bench() { timeout 30 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for r in 1 2; do for s in "256,1,16,32,128,128" "1,1,16,32,128,128"; do echo "== round $r $s"; bench --shape $s; done; done 2>&1 | tee $R/decode_bench.txt
pack
for T in 2048 8192 32768 131072 524288; do
  for P in exact fast; do
    reps=20; [ $T -ge 131072 ] && reps=5
    pb "$P T=$T" --precision $P --shape 1,$T,16,32,128,128 --repeats $reps --json $R/sweep_${P}_$T.json
  done
done 2>&1 | tee $R/sweep.txt
pack
cd ../..
timeout 100 python3 .gpu/anchors.py --impl fla --shapes "1,2048,16,32,128,128;1,8192,16,32,128,128;1,32768,16,32,128,128;1,131072,16,32,128,128;1,524288,16,32,128,128" --json $R/fla_sweep.json 2>&1 | tail -6
cd .dev/all
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck_nf 60 $CS --tool racecheck --error-exitcode 9 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite
run selftest 60 ./deltanet selftest --device cuda --count 30
pack

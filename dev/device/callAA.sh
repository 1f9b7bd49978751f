#!/usr/bin/env bash
# Staging by compile-time copier counts (stage_rows_by) and, in the split recurrent kernel, by
# the output warps only: correctness first (fused tests, non-finite rows, engine tests, GPU
# selftest with the vector files, racecheck and memcheck), then the issue's shapes beside FLA in
# the same call, the per-kernel times, the K split again, the T sweep.
# run(command="bash .dev/all/callAA.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
R=$OUT/aa; mkdir -p $R
pack() { tar czf $OUT/aa.tgz -C $OUT aa; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked|poisoned" $R/$name.txt | tail -4; }
run fused_equals 60 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run non_finite 40 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
run engine_test 40 ./engine_test --test-threads=1
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
pb() { local tag=$1; shift; timeout 40 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for P in exact fast; do
  for s in 1,32768,16,32,128,128 1,65536,16,32,128,128 8,8192,16,32,128,128 1,2048,16,32,128,128; do
    pb "$P $s" --precision $P --shape $s --repeats 20 --json $R/shape_${P}_${s//,/_}.json
  done
  pb "$P varlen64 1,65536" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 --json $R/shape_${P}_varlen64.json
done 2>&1 | tee $R/shapes.txt
for s in 1,32768,16,32,128,128 8,8192,16,32,128,128; do
  DELTANET_FUSED_ONLY=intra pb "intra-only exact $s" --shape $s --repeats 20
  DELTANET_FUSED_ONLY=recurrent pb "recurrent-only exact $s" --shape $s --repeats 20
done 2>&1 | tee $R/kernels.txt
for P in exact fast; do DELTANET_FUSED_KSPLIT=1 pb "ksplit $P 1,32768" --precision $P --shape 1,32768,16,32,128,128 --repeats 20; done 2>&1 | tee $R/ksplit.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 60 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 60 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
for T in 16384 131072 524288; do for P in exact fast; do
  pb "$P T=$T" --precision $P --shape 1,$T,16,32,128,128 --repeats 5 --json $R/sweep_${P}_$T.json
done; done 2>&1 | tee $R/sweep.txt
pack

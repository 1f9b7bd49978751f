#!/usr/bin/env bash
# The final build (the K split on by default for the exact precision): fused tests, engine
# tests, the GPU selftest with the vector files, racecheck, then the exact B=1 shapes.
# run(command="bash .dev/all/callAC.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
R=$OUT/ac; mkdir -p $R
pack() { tar czf $OUT/ac.tgz -C $OUT ac; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked" $R/$name.txt | tail -3; }
run fused_equals 50 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
run engine_test 30 ./engine_test --test-threads=1
run selftest 40 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
pb() { local tag=$1; shift; timeout 30 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for s in 1,32768,16,32,128,128 1,65536,16,32,128,128 1,2048,16,32,128,128; do
  pb "exact $s" --shape $s --repeats 20 --json $R/shape_exact_${s//,/_}.json
done 2>&1 | tee $R/shapes.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 50 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 1
pack

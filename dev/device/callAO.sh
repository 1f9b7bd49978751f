#!/usr/bin/env bash
# chunk_intra: the gate's cumsum as a segmented double-float scan on warp 0, the row norms by
# 16-byte loads (q's only with l2norm), the epilogue's tiles below the diagonal without
# per-element tests. Correctness first (non-finite rows: k's check now goes by its row's sum),
# then this build against deltanet_old (2d3f3dd) interleaved, the issue's shapes with FLA
# beside, the sanitizers last.
# run(command="bash .dev/all/callAO.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ao; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run fused_equals 120 env DELTANET_FUSED_CASES=4 ./fused_test fused_equals --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=4 ./fused_test fused_keeps_non_finite --nocapture
run fast_within_fla 60 ./fused_test fused_fast_precision --nocapture
run engine_test 60 ./engine_test --test-threads=1
run selftest 90 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
pbx() { local bin=$1 tag=$2; shift 2; timeout 40 ./$bin bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for round in 1 2; do
  for s in 1,32768,16,32,128,128 8,8192,16,32,128,128; do
    DELTANET_FUSED_ONLY=intra pbx deltanet_old "old intra $s" --shape $s --repeats 20
    DELTANET_FUSED_ONLY=intra pbx deltanet "new intra $s" --shape $s --repeats 20
  done
  for P in exact fast; do for s in 1,32768,16,32,128,128 8,8192,16,32,128,128 1,2048,16,32,128,128; do
    pbx deltanet_old "old $P $s" --precision $P --shape $s --repeats 20
    pbx deltanet "new $P $s" --precision $P --shape $s --repeats 20
  done; done
done 2>&1 | tee $R/ab.txt
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 70 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 70 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack

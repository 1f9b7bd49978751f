#!/usr/bin/env bash
# The final build of 2026-12-04 (ninth stop; GPU kernels as call AO's, only rustdoc changed in
# src/cuda): vectors and random problems on the GPU, compute-sanitizer memcheck and racecheck on
# the final kernels (default tuning, and racecheck with HBUF), the issue's shapes in both
# precisions with FLA beside, one call.
# run(command="bash .dev/all/callAU.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=au; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fused_equals 150 env DELTANET_FUSED_CASES=3 ./fused_test fused_equals --nocapture
run engine 120 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run racecheck_hbuf 90 env DELTANET_FUSED_HBUF=1 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

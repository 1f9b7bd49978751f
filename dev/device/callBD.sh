#!/usr/bin/env bash
# Thirteenth stop, last call: the recurrent kernels taking sequences longest first (this build,
# LATE_PLANES now the default where two whole buffers do not fit) against call BC's build
# (./deltanet_base, c47ee5d, LATE_PLANES by the environment), interleaved; then the issue shapes
# with FLA beside, the GPU selftest and the checks of this build, sanitizers last.
# run(command="bash .dev/all/callBD.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bd; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
pbx() { local bin=$1 tag=$2; shift 2; timeout 40 $bin bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
{
for round in 1 2; do
  DELTANET_FUSED_LATE=1 pbx ./deltanet_base "r$round base exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  pbx ./deltanet "r$round new exact varlen64" --precision exact --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  pbx ./deltanet_base "r$round base fast varlen64" --precision fast --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  pbx ./deltanet "r$round new fast varlen64" --precision fast --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
done
} 2>&1 | tee $R/ab.txt
pack
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run engine 60 ./engine_test --nocapture
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run racecheck 90 $CS --tool racecheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
run memcheck 90 $CS --tool memcheck --error-exitcode 9 ./deltanet selftest --device cuda --count 2
pack

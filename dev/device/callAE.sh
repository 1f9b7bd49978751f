#!/usr/bin/env bash
# Issue 10's bars in one run with the K = V = 128 decode kernel as the default (call AD measured
# it faster): the decode tests, our five decode shapes in two rounds around FLA's decode anchors,
# compute-sanitizer memcheck and racecheck over the GPU decode tests and a selftest run.
# run(command="bash .dev/all/callAE.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ae; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run decode_test 240 ./decode_test
pack
shapes=("256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128")
for s in "${shapes[@]}"; do echo "== round 1 $s"; db --shape $s; done 2>&1 | tee $R/decode_bench.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 60 python3 $TOP/.gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128;64,32,16,128,128" --json $R/fla_decode.json 2>&1 | tail -4 | tee $R/fla_decode.txt
for s in "${shapes[@]}"; do echo "== round 2 $s"; db --shape $s; done 2>&1 | tee -a $R/decode_bench.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  for t in gpu_pool_steps gpu_multi_token gpu_matches; do
    run ${tool}_$t 120 $CS --tool $tool --error-exitcode 9 ./decode_test $t --test-threads=1
  done
  run ${tool}_selftest 60 $CS --tool $tool --error-exitcode 9 ./deltanet selftest --device cuda --count 1
  pack
done

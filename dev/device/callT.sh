#!/usr/bin/env bash
# The decode step as landed (streaming cache hints on): GPU tests against the oracle, the
# issue's shapes, FLA's fused_recurrent beside in the same call, then compute-sanitizer
# (memcheck), then transformers' Qwen3-Next layer check (dev/device/qwen3next_check.py).
# run(command="bash .dev/all/callT.sh", carry=[".dev/all", ".gpu"]). About 4 min.
cd "$(dirname "$0")"
(time timeout 60 ./decode_test --test-threads=4 --nocapture) > $OUT/dt.txt 2>&1; grep -E "pool cases|test result" $OUT/dt.txt
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 20 --repeats 200 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128" "256,1,16,32,128,128 --state-v-first"; do echo "== $s"; bench --shape $s; done 2>&1 | tee $OUT/bench.txt
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 60 python3 .gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128;64,32,16,128,128" --json $OUT/fla.json 2>&1 | tail -4
cd .dev/all
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 45 $CS --tool memcheck --error-exitcode 9 ./decode_test gpu_multi --test-threads=1 > $OUT/memcheck.txt 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|test result" $OUT/memcheck.txt
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/deltanet-*.whl > /dev/null 2>&1
(time timeout 100 python3 dev/device/qwen3next_check.py --json $OUT/qwen3next.json) > $OUT/qwen3next.txt 2>&1; echo "qwen3next rc=$?"; grep -E "PASS|FAIL|overall" $OUT/qwen3next.txt

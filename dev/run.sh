#!/bin/bash
# One device call: decode correctness (GPU tests, compute-sanitizer), deltanet bench decode,
# FLA's fused_recurrent on the same shapes.
cd "$(dirname "$0")"
export RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee $OUT/smi.txt
echo "== decode tests"
timeout 60 ./decode_tests --test-threads=4 --nocapture > $OUT/decode_tests.log 2>&1; echo "decode_tests rc=$?"
grep -E "test result|FAILED|panicked|cases|GPU tests" $OUT/decode_tests.log | head -20
B=./deltanet
bench() { timeout 40 $B bench --device cuda --work decode --dtype bf16 --warmup 20 --repeats 100 "$@" 2>&1; }
{
echo "== N=1";        bench --shape 1,1,16,32,128,128
echo "== N=256";      bench --shape 256,1,16,32,128,128
echo "== N=64";       bench --shape 64,1,16,32,128,128
echo "== N=64 T=4";   bench --shape 64,1,16,32,128,128 --tokens 4
echo "== N=256 pool 1024"; bench --shape 256,1,16,32,128,128 --pool 1024
echo "== N=256 v_first";   bench --shape 256,1,16,32,128,128 --state-v-first
echo "== N=1 v_first";     bench --shape 1,1,16,32,128,128 --state-v-first
echo "== N=64 T=4 v_first"; bench --shape 64,1,16,32,128,128 --tokens 4 --state-v-first
} | tee $OUT/bench.log | grep -E "==|^decode|^d2d"
echo "== FLA"
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl && export PYTHONPATH=/tmp/site
timeout 60 python3 .dev/decode/fla_decode.py $OUT/fla.json 2>&1 | tail -5
timeout 30 python3 .gpu/anchors.py --impl fla --decode "1,32,16,128,128;256,32,16,128,128" --json $OUT/anchors.json 2>&1 | tail -3
cd .dev/decode
echo "== sanitizer"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 40 $CS --tool memcheck --error-exitcode 9 ./decode_tests gpu_multi --test-threads=1 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -3 $OUT/memcheck.log
timeout 25 $CS --tool racecheck --error-exitcode 9 ./decode_tests gpu_multi --test-threads=1 > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?"; tail -3 $OUT/racecheck.log
echo "== cuda tests (recurrent_step through the decode kernel)"
timeout 30 ./cuda_tests --test-threads=4 > $OUT/cuda_tests.log 2>&1; echo "cuda_tests rc=$?"
grep -E "test result|FAILED|panicked" $OUT/cuda_tests.log | head

#!/usr/bin/env bash
# Short call: FLA anchors, the regs kernel at the shapes callF's limits cut (B=8 T=8192, T=2048),
# exact and fast, and selftest on the GPU.
cd "$(dirname "$0")"
S2='8,8192,16,32,128,128;1,2048,16,32,128,128'
S='1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128'
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; grep -E "median|result|passed|failed" $OUT/$name.txt | tail -4; }
run regs_exact 70 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_TIME="$S2" ./fused_test --ignored fused_time --nocapture
run regs_fast 70 env DELTANET_FUSED_REGS=1 DELTANET_FUSED_PIECES=1 DELTANET_FUSED_TIME="$S2" ./fused_test --ignored fused_time --nocapture
run selftest 70 ./deltanet selftest --device cuda --count 20
cd ../..
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/fla/*.whl > /dev/null 2>&1; export PYTHONPATH=/tmp/site
timeout 120 python3 .gpu/anchors.py --impl fla --shapes "$S" --json $OUT/fla.json > $OUT/fla.txt 2>&1
tail -8 $OUT/fla.txt

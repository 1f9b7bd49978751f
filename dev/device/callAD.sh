#!/usr/bin/env bash
# For the next session's first call: the decode kernel with K = V = 128 as compile-time
# constants (opt-in, DELTANET_DECODE_CONST=1; host-emulated, not yet run on a GPU) against the
# generic one, interleaved, with the decode tests under it first.
# run(command="bash .dev/all/callAD.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
R=$OUT/ad; mkdir -p $R
pack() { tar czf $OUT/ad.tgz -C $OUT ad; }
( DELTANET_DECODE_CONST=1 timeout 60 ./decode_test --test-threads=1 ) > $R/decode_test_const.txt 2>&1; echo "rc=$?" >> $R/decode_test_const.txt
grep -E "test result|panicked|^rc" $R/decode_test_const.txt
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for round in 1 2; do for c in 0 1; do
  for s in "256,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128 --tokens 4" "1,1,16,32,128,128"; do
    echo "== round $round const=$c $s"; DELTANET_DECODE_CONST=$c bench --shape $s
  done
done; done 2>&1 | tee $R/decode_const.txt
pack

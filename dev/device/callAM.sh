#!/usr/bin/env bash
# The forward in windows: chunk_intra of window w + 1 on a second stream beside the recurrent
# kernel of window w (DELTANET_FUSED_WINDOWS=W; 1 is the build before). Correctness first (the
# windowed results equal one window bit for bit; fused_equals has a windowed tuning), then
# windows 1, 2, 4, 8, 16 on the issue's shapes in both precisions, exact also with one stage
# buffer (its 130 KB leave room for a chunk_intra block beside; two buffers take 220 KB).
# run(command="bash .dev/all/callAM.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=am; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
run windows_equal 90 env DELTANET_FUSED_CASES=8 ./fused_test fused_in_windows --nocapture
run fused_equals 90 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
run engine_test 60 ./engine_test --test-threads=1
pack
for round in 1 2; do
  for P in fast exact; do
    for s in 1,32768,16,32,128,128 1,2048,16,32,128,128; do
      for W in 1 2 4 8 16; do
        DELTANET_FUSED_WINDOWS=$W pb "$P W=$W $s" --precision $P --shape $s --repeats 20
      done
    done
  done
  for W in 1 4 8 16; do
    DELTANET_FUSED_NBUF=1 DELTANET_FUSED_WINDOWS=$W pb "exact nbuf1 W=$W 1,32768" --precision exact --shape 1,32768,16,32,128,128 --repeats 20
  done
done 2>&1 | tee $R/windows.txt
pack
for P in fast exact; do
  for W in 1 4 8; do
    DELTANET_FUSED_WINDOWS=$W pb "$P W=$W 8,8192" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
    DELTANET_FUSED_WINDOWS=$W pb "$P W=$W varlen64" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
    DELTANET_FUSED_WINDOWS=$W pb "$P W=$W 1,65536" --precision $P --shape 1,65536,16,32,128,128 --repeats 20
  done
done 2>&1 | tee $R/windows_more.txt
pack
DELTANET_FUSED_ONLY=intra pb "intra alone 1,32768" --shape 1,32768,16,32,128,128 --repeats 20 | tee $R/split.txt
for P in fast exact; do
  DELTANET_FUSED_ONLY=recurrent pb "$P recurrent alone 1,32768" --precision $P --shape 1,32768,16,32,128,128 --repeats 20
done 2>&1 | tee -a $R/split.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack

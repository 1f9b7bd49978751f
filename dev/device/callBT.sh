#!/usr/bin/env bash
# The shortest useful call (device time nearly spent): WG_TRI (the triangular products on
# wgmma too) checked against the stage path (fused_equals, one case of every tuning) and by
# racecheck, A/B DELTANET_FUSED_WGTRI=0|1 in both precisions at B=8 and varlen, then FLA at the
# same shapes.
# run(command="bash .dev/all/callBT.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bt; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run fused_equals 60 env DELTANET_FUSED_WGTRI=1 DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
pack
{
for P in exact fast; do
  for s in 8,8192,16,32,128,128 varlen; do
    if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
    for W in 0 1 0 1; do
      DELTANET_FUSED_WGTRI=$W pb "wgtri=$W $P $s" --precision $P $a --repeats 20
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
for P in exact fast; do
  run race_tri_$P 40 env DELTANET_FUSED_WGTRI=1 DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --precision $P --shape 2,300,4,8,128,128
done
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
PYTHONPATH=/tmp/site timeout 60 python3 $TOP/.gpu/anchors.py --impl fla --shapes "8,8192,16,32,128,128" --varlen "64,65536,16,32,128,128" --json $R/fla.json 2>&1 | tail -3 | tee $R/fla.txt
pack

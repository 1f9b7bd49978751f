#!/usr/bin/env bash
# The landed build and the opt-in WG_TRI (the triangular products on wgmma too; host-emulated
# only so far), on the issue shapes beside FLA in one call: (1) checks with WG_TRI on (fused_equals
# one case of every tuning, selftest on the vectors, non-finite rows); (2) A/B
# DELTANET_FUSED_WGTRI=0|1, both precisions, the five issue shapes, two rounds interleaved, JSON
# per run; (3) FLA and FlashQLA on the same shapes (callBR1.sh installed their wheels just
# before, on the same warm machine). Sanitizers and time per token follow in the next call,
# on the build chosen from this one.
# run(command="bash .dev/all/callBR.sh", carry=[".dev/all", ".gpu/z3", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=br; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
export DELTANET_FUSED_WGTRI=1
run fused_equals 120 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
run selftest 90 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run fast 90 env DELTANET_FUSED_CASES=6 ./fused_test fused_fast_precision --nocapture
run non_finite 60 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite --nocapture
unset DELTANET_FUSED_WGTRI
pack
{
for round in 1 2; do
  for P in exact fast; do
    for s in ${ISSUE_SHAPES//;/ } varlen; do
      if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
      for W in 0 1; do
        DELTANET_FUSED_WGTRI=$W pb "r$round wgtri=$W $P $s" --precision $P $a --repeats 20 --json $R/ab_r${round}_w${W}_${P}_${s//,/_}.json
      done
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/z3/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?"
export PYTHONPATH=/tmp/site
timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
timeout 250 python3 $TOP/.gpu/anchors.py --impl flashqla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/qla_shapes.json 2>&1 | tail -6 | tee $R/qla.txt
pack

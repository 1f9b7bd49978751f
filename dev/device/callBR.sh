#!/usr/bin/env bash
# The landed build and the opt-in WG_TRI (the triangular products on wgmma too; host-emulated
# only before this call), in one call, most wanted first: (1) checks with WG_TRI on
# (fused_equals, one case of every tuning; selftest on the vectors); (2) A/B
# DELTANET_FUSED_WGTRI=0|1, both precisions, B=8, varlen and T=32768 (the recurrent kernel's
# shapes; a second round: exact B=8 and varlen), JSON per run; (3) the setting to land chosen
# from (2) (exact B=8 and varlen, both rounds); with it T=2048 (the split kernel) and T=65536;
# FLA on the issue shapes; (4) with that setting: the fast test, non-finite rows,
# engine, racecheck both precisions, memcheck varlen; FlashQLA on the issue shapes beside FLA when
# callBR1.sh installed its wheels just before on this machine. callBS.sh follows on the same
# machine: sanitizers over a selftest run, time per token.
# run(command="bash .dev/all/callBR.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
# (add ".gpu/z3" after callBR1.sh for FlashQLA)
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=br; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run fused_equals 120 env DELTANET_FUSED_WGTRI=1 DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
run selftest 90 env DELTANET_FUSED_WGTRI=1 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
pack
{
for round in 1 2; do
  for P in exact fast; do
    shapes="8,8192,16,32,128,128 varlen 1,32768,16,32,128,128"; [ $round = 2 ] && shapes="8,8192,16,32,128,128 varlen"
    [ $round = 2 ] && [ $P = fast ] && continue
    for s in $shapes; do
      if [ $s = varlen ]; then a="--shape 1,65536,16,32,128,128 --varlen 64"; else a="--shape $s"; fi
      for W in 0 1; do
        DELTANET_FUSED_WGTRI=$W pb "r$round wgtri=$W $P $s" --precision $P $a --repeats 20 --json $R/ab_r${round}_w${W}_${P}_${s//,/_}.json
      done
    done
  done
done
} 2>&1 | tee $R/ab.txt
pack
# WG_TRI lands if its exact B=8 and varlen medians (both rounds) sum lower and its checks passed.
sum() { grep -E "wgtri=$1 exact (8,8192|varlen)" $R/ab.txt | awk '{s += $6} END {print s + 0}'; }
W=0
if grep -q "rc=0" $R/fused_equals.txt && grep -q "rc=0" $R/selftest.txt \
   && awk -v a="$(sum 1)" -v b="$(sum 0)" 'BEGIN {exit !(a > 0 && a < b)}'; then W=1; fi
echo "wgtri sums: on $(sum 1) off $(sum 0) -> W=$W" | tee $R/choice.txt
export DELTANET_FUSED_WGTRI=$W; echo $W > /tmp/deltanet_wgtri
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1; echo "pip rc=$?"
ls $TOP/.gpu/z3/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/z3/*.whl >> $R/pip.txt 2>&1
export PYTHONPATH=/tmp/site
for P in exact fast; do
  for s in 1,2048,16,32,128,128 1,65536,16,32,128,128; do
    pb "chosen wgtri=$W $P $s" --precision $P --shape $s --repeats 20 --json $R/chosen_${P}_${s//,/_}.json
  done
done 2>&1 | tee $R/chosen.txt
timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
if python3 -c "import flash_qla" 2>/dev/null; then
  timeout 200 python3 $TOP/.gpu/anchors.py --impl flashqla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/qla_shapes.json 2>&1 | tail -6 | tee $R/qla.txt
  pack
fi
checks_and_sanitizers
pack

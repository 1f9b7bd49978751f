#!/usr/bin/env bash
# chunk_intra's register budget (`DELTANET_FUSED_INTRABLOCKS` = 3, 4, 5 blocks an SM: 80, 64, 48
# registers; offline, the fast module spills 372 bytes at 5, the exact one none): chunk_intra alone
# and the forward, both precisions, B=8 T=8192, interleaved, two rounds; then fused_equals (its
# tunings include 3 and 5). On an H200 first issue 8's bar (callCI.sh's issue shapes beside FLA)
# and its time per token last; on another card FLA at B=8 beside the forwards (callCL.sh's anchor).
# Staging: dev/device/stage.sh; run(command="bash .dev/all/callCM.sh",
#   carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
. ./lib.sh
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
if [ $H200 = 1 ]; then
  TAG=ci; R=$OUT/$TAG; mkdir -p $R
  nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
  shapes_beside_fla
fi
TAG=cm; R=$OUT/$TAG; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
# ib LABEL ARGS...: the three budgets interleaved, two rounds.
ib() {
  local tag=$1 r n; shift
  for r in 1 2; do for n in 4 3 5; do
    DELTANET_FUSED_INTRABLOCKS=$n pbin deltanet "ib$n $tag" "$@"
  done; done
}
{
  for P in fast exact; do
    DELTANET_FUSED_ONLY=intra ib "intra-only $P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
    ib "$P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  done
} 2>&1 | tee $R/ab.txt
pack
if [ $H200 = 0 ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
  PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "8,8192,16,32,128,128" --json $R/fla.json 2>&1 | tail -4 | tee $R/fla.txt
  for P in exact fast; do pb "$P B=8 after FLA" --precision $P --shape 8,8192,16,32,128,128 --repeats 20; done | tee $R/ours_after_fla.txt
  pack
fi
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
pack
if [ $H200 = 1 ]; then
  TAG=ci; R=$OUT/$TAG
  per_token 16384 131072 262144 524288
  pack
fi

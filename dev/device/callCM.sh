#!/usr/bin/env bash
# chunk_intra's register budget (`DELTANET_FUSED_INTRABLOCKS` = 3, 4, 5 blocks an SM: 80, 64, 48
# registers; offline, the fast module spills 372 bytes at 5, the exact one none) and the
# recurrent kernel capped at 192 registers (`DELTANET_FUSED_RECREGS=192`; no spills offline):
# each kernel alone and the forward, both precisions, B=8 T=8192, interleaved, two rounds; then
# fused_equals (its tunings include both). Then the forward pipelined over groups of sequences
# (`DELTANET_FUSED_GROUPS`, chunk_intra of group g + 1 beside the recurrent kernel of group g on
# a second stream), fast, with the cap and one buffer of planes (`late`, the same without groups). On an H200 first issue 8's bar (callCI.sh's issue shapes beside FLA)
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
# v VARIANT LABEL ARGS...: one bench line with a variant's setting: base (none), ib3 and ib5
# (chunk_intra's register budget), r192 (the recurrent kernel capped at 192 registers: it compiles
# in 192 without spills and would leave room for a chunk_intra block or a producer warpgroup).
v() {
  local var=$1 tag=$2; shift 2
  case $var in
    base) pbin deltanet "base $tag" "$@" ;;
    ib3) DELTANET_FUSED_INTRABLOCKS=3 pbin deltanet "ib3 $tag" "$@" ;;
    ib5) DELTANET_FUSED_INTRABLOCKS=5 pbin deltanet "ib5 $tag" "$@" ;;
    r192) DELTANET_FUSED_RECREGS=192 pbin deltanet "r192 $tag" "$@" ;;
    late) DELTANET_FUSED_RECREGS=192 DELTANET_FUSED_LATE=1 pbin deltanet "late $tag" "$@" ;;
    pipe2) DELTANET_FUSED_GROUPS=2 DELTANET_FUSED_RECREGS=192 DELTANET_FUSED_LATE=1 pbin deltanet "pipe2 $tag" "$@" ;;
    pipe4) DELTANET_FUSED_GROUPS=4 DELTANET_FUSED_RECREGS=192 DELTANET_FUSED_LATE=1 pbin deltanet "pipe4 $tag" "$@" ;;
  esac
}
{
  for r in 1 2; do
    for P in fast exact; do
      S="--precision $P --shape 8,8192,16,32,128,128 --repeats 20"
      for x in base ib3 ib5; do DELTANET_FUSED_ONLY=intra v $x "intra-only $P B=8" $S; done
      for x in base r192; do DELTANET_FUSED_ONLY=recurrent v $x "recurrent-only $P B=8" $S; done
      for x in base ib3 ib5 r192; do v $x "$P B=8" $S; done
    done
    # The two kernels pipelined over groups of sequences (fast: the recurrent block at 192
    # registers and 180 KB leaves room for one chunk_intra block an SM).
    S="--precision fast --shape 8,8192,16,32,128,128 --repeats 20"
    for x in late pipe2 pipe4; do v $x "fast B=8" $S; done
    S="--precision fast --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20"
    for x in base late pipe2 pipe4; do v $x "fast varlen" $S; done
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

#!/usr/bin/env bash
# The fast precision's doubling on one TF32 pass (DSPLIT = 2: A_inv is rounded to one bf16 piece
# after it) against the landed build (`deltanet_base`): chunk_intra alone and the forward, fast,
# B=8 T=8192, interleaved; the fast checks of the new build (selftest --precision fast against
# FLA's error per file, the fast test on random problems; the exact modules are unchanged). On an H200 also
# callCI.sh's work (issue 8's bar with the landed build, beside FLA; its time per token last).
# Staging: main's build copied to .dev/all/deltanet_base, then dev/device/stage.sh with the change.
# run(command="bash .dev/all/callCK.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
. ./lib.sh
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
if [ $H200 = 1 ]; then
  # callCI.sh's work, its time per token moved to the end (the A/B and checks before it).
  TAG=ci; R=$OUT/$TAG; mkdir -p $R
  BIN=deltanet_base; echo "binary: $BIN" | tee $R/binary.txt
  nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
  shapes_beside_fla
  unset BIN
fi
TAG=ck; R=$OUT/$TAG; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
{
  DELTANET_FUSED_ONLY=intra ab_bins "intra-only fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  ab_bins "fast B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  ab_bins "fast varlen" --precision fast --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
} 2>&1 | tee $R/ab.txt
pack
run selftest_fast 120 ./deltanet selftest --device cuda --precision fast --vectors $TOP/.gpu/vectors
run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
pack
if [ $H200 = 1 ]; then
  TAG=ci; R=$OUT/$TAG
  BIN=deltanet_base per_token 16384 131072 262144 524288
  pack
fi

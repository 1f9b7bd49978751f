#!/usr/bin/env bash
# chunk_intra: the a_inv rows from 16-byte loads of A_inv's row and of beta (four LDS.128 where
# sixteen 4-byte loads were) and, in the fast precision, its decays by the hardware exp2. A/B of
# this build (`deltanet`) against the previous one (`deltanet_base`: the binary of 2579a36,
# copied into .dev/all after dev/device/stage.sh), interleaved (chunk_intra alone and the forward,
# fast and exact, B=8); the checks of this build (selftest both precisions, fused_equals, the
# fast test, non-finite rows, engine, sanitizers); then Nsight Compute on its fast chunk_intra
# (B=8 T=4096; stall samples and shared-memory wavefronts by instruction, `dev/ncu_phases.py`).
# run(command="bash .dev/all/callCG.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=cg; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
intra_ab_checks_ncu ab_bins

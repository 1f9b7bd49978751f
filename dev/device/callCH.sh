#!/usr/bin/env bash
# chunk_intra, three builds against the landed one (`deltanet_base`): `deltanet_pf`, the next
# item's bounds, g and beta prefetched (dev/device/pending/chunk_intra_prefetch_measured.patch);
# `deltanet_bal`, the products' tiles balanced over the warps (three at most a warp, where four
# warps had four and two none); `deltanet`, dev/device/pending/chunk_intra_balance_measured.patch:
# both, with the diagonal substitution done by the warp that formed each diagonal block, beside
# the other warps' epilogues, and the doubling's inner barriers a warp's (level 1) and a pair
# of warps' (level 2): 6 block barriers an item, not 9. Staging: the landed build's deltanet
# copied to .dev/all/deltanet_base, each patched build's to its name, dev/device/stage.sh last
# with the full patch applied (its tests are the ones build_checks runs). A build left out is
# skipped. Interleaved, two rounds (chunk_intra alone and the forward, fast and exact, B=8);
# the checks of `deltanet`; Nsight Compute on its fast chunk_intra.
# run(command="bash .dev/all/callCH.sh", carry=[".dev/all", ".gpu/vectors"], kind="nvidia-h100-x1")
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ch; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
ab4() { ab_over "deltanet_base deltanet_pf deltanet_bal deltanet" "$@"; }
intra_ab_checks_ncu ab4

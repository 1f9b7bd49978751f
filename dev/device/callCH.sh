#!/usr/bin/env bash
# chunk_intra, three builds against the landed one (`deltanet_base`): `deltanet_pf`, the next
# item's bounds, g and beta prefetched (dev/device/pending/chunk_intra_prefetch_offline.patch);
# `deltanet_bal`, the products' tiles balanced over the warps (three at most a warp, where four
# warps had four and two none); `deltanet`, dev/device/pending/chunk_intra_balance_offline.patch:
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
ab4() { local tag=$1 b r; shift; for r in 1 2; do for b in deltanet_base deltanet_pf deltanet_bal deltanet; do [ -x ./$b ] && pbin $b "$b $tag" "$@"; done; done; }
{
for P in fast exact; do
  DELTANET_FUSED_ONLY=intra ab4 "intra-only $P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  ab4 "$P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
done
} 2>&1 | tee $R/ab.txt
pack
build_checks
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
k=chunk_intra
timeout 150 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis --kernel-name regex:"^$k\$" --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --precision fast --shape 8,4096,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
"$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
"$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
rm -f $R/$k.ncu-rep
grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|No Eligible|Achieved Occ|Memory Throughput|DRAM Throughput|L1/TEX|Shared|Bank" $R/${k}_details.txt | head -20
pack

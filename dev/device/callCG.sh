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
{
for P in fast exact; do
  DELTANET_FUSED_ONLY=intra ab_bins "intra-only $P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  ab_bins "$P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
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

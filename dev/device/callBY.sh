#!/usr/bin/env bash
# Where the fast precision's time goes now (chunk_intra with the diagonals and the doubling, the
# fast recurrent kernel): each kernel alone and the whole forward at B=8 T=8192, then Nsight
# Compute's per-instruction stall samples of both kernels at B=8 T=4096 (fast), to choose #9's
# next step (p formed in the recurrent kernel, or chunk_intra's phases).
# run(command="bash .dev/all/callBY.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=${TAG:-by}; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
for round in 1 2; do
  DELTANET_FUSED_ONLY=intra pb "fast intra-only B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  DELTANET_FUSED_ONLY=recurrent pb "fast recurrent-only B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
  pb "fast whole B=8" --precision fast --shape 8,8192,16,32,128,128 --repeats 20
done 2>&1 | tee $R/split.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in chunk_intra chunk_recurrent_regs; do
  timeout 150 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --kernel-name regex:"^$k\$" --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --precision fast --shape 8,4096,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
  rm -f $R/$k.ncu-rep
  grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occ|Block Limit|Memory Throughput|DRAM Throughput|L1/TEX Hit|Shared|Bank" $R/${k}_details.txt | head -30
  pack
done

#!/usr/bin/env bash
# Fourteenth stop, first call: where the exact kernels' time goes now (build dcdd477: planes'
# upper blocks skipped, LATE_PLANES the default, longest first). Nsight Compute per-instruction
# stall samples of chunk_intra and of the plain 128-column exact recurrent kernel at B=8, and
# each kernel alone at the B=8 issue shape, to choose between reworking chunk_intra (both value
# heads of a qk head in one block) and the recurrent kernel's step.
# run(command="bash .dev/all/callBE.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=be; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
for P in exact fast; do
  DELTANET_FUSED_ONLY=intra pb "$P intra-only B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  DELTANET_FUSED_ONLY=recurrent pb "$P recurrent-only B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  pb "$P whole B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
done 2>&1 | tee $R/split.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in chunk_intra chunk_recurrent_regs; do
  timeout 150 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --kernel-name regex:"^$k\$" --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --precision exact --shape 8,4096,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
  rm -f $R/$k.ncu-rep
  grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occ|Block Limit|Memory Throughput|DRAM Throughput|L1/TEX Hit|Shared" $R/${k}_details.txt | head -30
  pack
done

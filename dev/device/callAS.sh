#!/usr/bin/env bash
# What context parallelism inside the card could buy (the design note in NOTES-GPU.md, call AS):
# the forward split into its two kernels (DELTANET_FUSED_ONLY) at B=1 T=32768 (128 blocks of 32
# state columns, 512 chunks deep) against B=4 T=8192 (the same tokens as four sequences: 128
# blocks of 128 columns, 128 chunks deep, what four segments of one sequence would run) and B=8
# T=8192, both precisions; then Nsight Compute's speed-of-light and memory sections of chunk_intra
# (exact and fast) and of the 128-column recurrent kernel.
# run(command="bash .dev/all/callAS.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=as; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
for P in fast exact; do
  for s in 1,32768,16,32,128,128 4,8192,16,32,128,128 8,8192,16,32,128,128; do
    pb "$P full $s" --precision $P --shape $s --repeats 10
    DELTANET_FUSED_ONLY=intra pb "$P intra $s" --precision $P --shape $s --repeats 10
    DELTANET_FUSED_ONLY=recurrent pb "$P recurrent $s" --precision $P --shape $s --repeats 10
  done
done 2>&1 | tee $R/split.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof() {
  local name=$1 k=$2 P=$3 s=$4
  timeout 90 "$NCU" --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --kernel-name regex:$k --launch-skip 2 --launch-count 1 -f -o $R/$name ./deltanet bench --device cuda --work prefill --dtype bf16 --precision $P --shape $s --warmup 2 --repeats 1 > $R/${name}_run.txt 2>&1
  "$NCU" -i $R/$name.ncu-rep --page details > $R/${name}_details.txt 2>&1
  rm -f $R/$name.ncu-rep
  grep -E "DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Duration|Achieved Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Issued Warp" $R/${name}_details.txt | head -12
}
prof intra_exact chunk_intra exact 1,8192,16,32,128,128
prof intra_fast chunk_intra fast 1,8192,16,32,128,128
prof rec_fast_b4 chunk_recurrent_regs fast 4,2048,16,32,128,128
prof rec_exact_b4 chunk_recurrent_regs exact 4,2048,16,32,128,128
pack

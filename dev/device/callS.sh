#!/usr/bin/env bash
# One device call: Nsight Compute over chunk_recurrent_regs (B=1: 2 warps per block; B=8: 8)
# and the decode kernel (N=256): stall reasons, issue, memory, per-instruction samples.
# run(command="bash .dev/all/callS.sh", carry=[".dev/all"]). About 4 min at most.
cd "$(dirname "$0")"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECT="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
prof() { local name=$1; shift; timeout 100 "$NCU" --clock-control none $SECT -f -o $OUT/$name "$@" > $OUT/${name}_run.txt 2>&1; echo "$name rc=$?"
  "$NCU" -i $OUT/$name.ncu-rep --page details > $OUT/${name}_details.txt 2>&1
  "$NCU" -i $OUT/$name.ncu-rep --page source --csv --print-source sass > $OUT/${name}_sass.csv 2>&1 || true
  grep -E "Duration|Executed Ipc|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Active Warps Per Scheduler|Eligible Warps" $OUT/${name}_details.txt | head -24; }
DELTANET_FUSED_REGS=1 DELTANET_FUSED_TIME=1,8192,16,32,128,128 prof regs_b1 --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 ./fused_test --ignored fused_time --nocapture
DELTANET_FUSED_TIME=8,2048,16,32,128,128 prof regs_b8 --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 ./fused_test --ignored fused_time --nocapture
prof decode256 --kernel-name regex:decode --launch-skip 3 --launch-count 1 ./deltanet bench --device cuda --work decode --dtype bf16 --shape 256,1,16,32,128,128 --warmup 2 --repeats 3
ls -la $OUT | head -30

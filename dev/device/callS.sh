#!/usr/bin/env bash
# One device call: Nsight Compute over chunk_recurrent_regs (B=1: 2 warps per block; B=8: 8)
# and the decode kernel (N=256): stall reasons, issue, memory, per-instruction samples; first
# the decode step with and without its streaming cache hints (DELTANET_DECODE_HINTS), A/B twice,
# beside a device copy of the same bytes (the bench prints it).
# run(command="bash .dev/all/callS.sh", carry=[".dev/all"]). About 4 min at most.
cd "$(dirname "$0")"
bench() { timeout 40 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 20 --repeats 200 "$@" 2>&1 | grep -E "^decode|^d2d|copy" | head -3; }
for round in 1 2; do for h in 0 1; do
  echo "== round $round DELTANET_DECODE_HINTS=$h"; export DELTANET_DECODE_HINTS=$h
  echo "-- N=256"; bench --shape 256,1,16,32,128,128
  echo "-- N=256 pool 1024"; bench --shape 256,1,16,32,128,128 --pool 1024
  echo "-- N=64 T=4"; bench --shape 64,1,16,32,128,128 --tokens 4
  echo "-- N=64"; bench --shape 64,1,16,32,128,128
  echo "-- N=1"; bench --shape 1,1,16,32,128,128
  echo "-- N=256 v_first"; bench --shape 256,1,16,32,128,128 --state-v-first
done; done 2>&1 | tee $OUT/decode_ab.txt
unset DELTANET_DECODE_HINTS
timeout 60 env DELTANET_DECODE_HINTS=1 ./decode_test --test-threads=4 > $OUT/decode_test_hints.txt 2>&1; echo "decode_test (hints) rc=$?"; grep -E "test result" $OUT/decode_test_hints.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECT="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
prof() { local name=$1; shift; timeout 100 "$NCU" --clock-control none $SECT -f -o $OUT/$name "$@" > $OUT/${name}_run.txt 2>&1; echo "$name rc=$?"
  "$NCU" -i $OUT/$name.ncu-rep --page details > $OUT/${name}_details.txt 2>&1
  "$NCU" -i $OUT/$name.ncu-rep --page source --csv --print-source sass > $OUT/${name}_sass.csv 2>&1 || true
  grep -E "Duration|Executed Ipc|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Active Warps Per Scheduler|Eligible Warps" $OUT/${name}_details.txt | head -24; }
DELTANET_FUSED_REGS=1 DELTANET_FUSED_TIME=1,8192,16,32,128,128 prof regs_b1 --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 ./fused_test --ignored fused_time --nocapture
DELTANET_FUSED_TIME=8,2048,16,32,128,128 prof regs_b8 --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 ./fused_test --ignored fused_time --nocapture
DELTANET_DECODE_HINTS=1 prof decode256_hints --kernel-name regex:decode --launch-skip 3 --launch-count 1 ./deltanet bench --device cuda --work decode --dtype bf16 --shape 256,1,16,32,128,128 --warmup 2 --repeats 3
prof decode256 --kernel-name regex:decode --launch-skip 3 --launch-count 1 ./deltanet bench --device cuda --work decode --dtype bf16 --shape 256,1,16,32,128,128 --warmup 2 --repeats 3
ls -la $OUT | head -30

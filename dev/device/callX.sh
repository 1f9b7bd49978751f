#!/usr/bin/env bash
# chunk_intra with unrolled solve loops and vector stores, o written by the recurrent kernels in
# its own dtype (no cast pass): correctness (fused_equals, engine_test with fused cases in bf16
# and f16), the issue shapes through the engine API, chunk_intra alone, then Nsight Compute over
# chunk_intra and the split recurrent kernel (stall reasons, per-instruction samples).
# run(command="bash .dev/all/callX.sh", carry=[".dev/all"]). About 4 min.
cd "$(dirname "$0")"
R=$OUT/x; mkdir -p $R
pack() { tar czf $OUT/x.tgz -C $OUT x; }
run() { local name=$1; shift; echo "== $name: $*"; ( time timeout "$@" ) > $R/$name.txt 2>&1; echo "rc=$?" >> $R/$name.txt; grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked" $R/$name.txt | tail -6; }
run fused_equals 80 env DELTANET_FUSED_CASES=4 ./fused_test fused_equals --nocapture
run engine_test 60 ./engine_test --test-threads=1
pack
pb() { local tag=$1; shift; timeout 60 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for P in exact fast; do
  for s in 1,32768,16,32,128,128 8,8192,16,32,128,128 1,2048,16,32,128,128; do
    pb "$P $s" --precision $P --shape $s --repeats 20 --json $R/shape_${P}_${s//,/_}.json
  done
  pb "$P varlen64 1,65536" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 --json $R/shape_${P}_varlen64.json
done 2>&1 | tee $R/shapes.txt
for s in 1,32768,16,32,128,128 8,8192,16,32,128,128; do
  DELTANET_FUSED_ONLY=intra pb "intra-only exact $s" --shape $s --repeats 20
  DELTANET_FUSED_ONLY=recurrent pb "recurrent-only exact $s" --shape $s --repeats 20
done 2>&1 | tee $R/intra.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECT="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
prof() { local name=$1; shift; timeout 90 "$NCU" --clock-control none $SECT -f -o $R/$name "$@" > $R/${name}_run.txt 2>&1; echo "$name rc=$?"
  "$NCU" -i $R/$name.ncu-rep --page details > $R/${name}_details.txt 2>&1
  "$NCU" -i $R/$name.ncu-rep --page raw --csv > $R/${name}_raw.csv 2>&1
  "$NCU" -i $R/$name.ncu-rep --page source --csv --print-source sass > $R/${name}_sass.csv 2>&1 || true
  rm -f $R/$name.ncu-rep
  grep -E "Duration|Executed Ipc|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Active Warps Per Scheduler|Eligible Warps|Executed Instructions  " $R/${name}_details.txt | head -24; }
prof intra --kernel-name regex:chunk_intra --launch-skip 2 --launch-count 1 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,8192,16,32,128,128 --warmup 2 --repeats 1
prof split --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,8192,16,32,128,128 --warmup 2 --repeats 1
pack

#!/usr/bin/env bash
# Nsight Compute's per-instruction counts and stall samples of chunk_intra and of the exact
# recurrent kernel after call AK's chunk_intra (B=1 T=8192, exact), to pick chunk_intra's next
# change from executed instructions rather than static SASS.
# run(command="bash .dev/all/callAN.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
TAG=an; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in chunk_intra chunk_recurrent_regs; do
  timeout 100 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --kernel-name regex:$k --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,8192,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
  rm -f $R/$k.ncu-rep
  pack
done

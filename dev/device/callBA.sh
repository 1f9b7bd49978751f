#!/usr/bin/env bash
# Twelfth stop, first call: the issue's shapes of the current build beside FLA on this card, then
# Nsight Compute's stall reasons and per-instruction counts of the plain 128-column exact
# recurrent kernel (the one B=8 and the segments run), to choose its next change.
# run(command="bash .dev/all/callBA.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=ba; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; cat $R/gpu.txt
issue_shapes 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
pack
for P in exact fast; do
  DELTANET_FUSED_ONLY=intra pb "$P intra-only B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  DELTANET_FUSED_ONLY=recurrent pb "$P recurrent-only B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
done 2>&1 | tee $R/split.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
k=chunk_recurrent_regs
timeout 120 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis --kernel-name regex:$k --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 8,4096,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
"$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
"$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
rm -f $R/$k.ncu-rep
grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|No Eligible|Stall|Registers|Achieved Occ|Pipe" $R/${k}_details.txt | head -40
pack

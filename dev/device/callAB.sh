#!/usr/bin/env bash
# The kernels of call AA: the split recurrent kernel at B=8 and varlen (DELTANET_FUSED_SPLIT=1)
# and the K split at every shape (exact), beside the defaults; Nsight Compute's per-instruction
# samples of chunk_intra and of the split recurrent kernel (B=1 T=8192); decode once more.
# run(command="bash .dev/all/callAB.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
R=$OUT/ab; mkdir -p $R
pack() { tar czf $OUT/ab.tgz -C $OUT ab; }
pb() { local tag=$1; shift; timeout 40 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for P in exact fast; do for s in 8,8192,16,32,128,128 "1,65536,16,32,128,128 --varlen 64"; do
  pb "default $P $s" --precision $P --shape $s --repeats 20
  DELTANET_FUSED_SPLIT=1 pb "split $P $s" --precision $P --shape $s --repeats 20
done; done 2>&1 | tee $R/split_b8.txt
for s in 1,32768,16,32,128,128 1,65536,16,32,128,128 1,2048,16,32,128,128; do
  pb "default exact $s" --shape $s --repeats 20
  DELTANET_FUSED_KSPLIT=1 pb "ksplit exact $s" --shape $s --repeats 20
done 2>&1 | tee $R/ksplit.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in chunk_intra chunk_recurrent_regs; do
  timeout 100 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --kernel-name regex:$k --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,8192,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
  "$NCU" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
  rm -f $R/$k.ncu-rep
done
pack
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for s in "256,1,16,32,128,128" "1,1,16,32,128,128"; do echo "== $s"; bench --shape $s; done 2>&1 | tee $R/decode_bench.txt
pack

#!/usr/bin/env bash
# Tuning knobs on the kernels of call Y (no rebuild of the kernels): one stage buffer
# (DELTANET_FUSED_NBUF=1: half the shared memory, two blocks of the plain recurrent kernel per SM)
# at B=8 and varlen, exact and fast; the decode shapes in three rounds; Nsight Compute's
# per-instruction stall samples of the split recurrent kernel (B=1 T=8192).
# run(command="bash .dev/all/callZ.sh", carry=[".dev/all"])
cd "$(dirname "$0")"
R=$OUT/z; mkdir -p $R
pack() { tar czf $OUT/z.tgz -C $OUT z; }
pb() { local tag=$1; shift; timeout 40 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
for round in 1 2; do for P in exact fast; do
  for s in 8,8192,16,32,128,128 "1,65536,16,32,128,128 --varlen 64" 1,32768,16,32,128,128; do
    pb "nbuf2 $P $s" --precision $P --shape $s --repeats 20
    DELTANET_FUSED_NBUF=1 pb "nbuf1 $P $s" --precision $P --shape $s --repeats 20
  done
done; done 2>&1 | tee $R/nbuf.txt
pack
bench() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
for round in 1 2 3; do
  for s in "256,1,16,32,128,128" "1,1,16,32,128,128" "256,1,16,32,128,128 --pool 1024" "64,1,16,32,128,128" "64,1,16,32,128,128 --tokens 4"; do echo "== $round $s"; bench --shape $s; done
done 2>&1 | tee $R/decode_bench.txt
pack
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 120 "$NCU" --clock-control none --section WarpStateStats --section SourceCounters --kernel-name regex:chunk_recurrent_regs --launch-skip 2 --launch-count 1 -f -o $R/split ./deltanet bench --device cuda --work prefill --dtype bf16 --shape 1,8192,16,32,128,128 --warmup 2 --repeats 1 > $R/split_run.txt 2>&1
"$NCU" -i $R/split.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/split_sass.csv.gz
rm -f $R/split.ncu-rep
ls -la $R
pack

# Helpers the device call scripts source (after setting R, the results folder under $OUT, and
# TAG, the archive's name): pack the results after each part, run a check with a time limit,
# time the prefill or the decode with `deltanet bench`.
pack() { tar czf "$OUT/$TAG.tgz" -C "$OUT" "$TAG"; }
# run NAME SECONDS COMMAND...: output in $R/NAME.txt with its exit status; the summary lines shown.
run() {
  local name=$1; shift
  echo "== $name: $*"
  ( time timeout "$@" ) > "$R/$name.txt" 2>&1
  echo "rc=$?" >> "$R/$name.txt"
  grep -E "median|test result|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc=|worst|panicked|poisoned" "$R/$name.txt" | tail -4
}
# pb LABEL ARGS...: one prefill bench line, labelled, of $BIN (default deltanet).
pb() { pbin "${BIN:-deltanet}" "$@"; }
# pbin BINARY LABEL ARGS...: pb with another binary of .dev/all (an A/B's `deltanet_base`).
pbin() { local b=$1 tag=$2; shift 2; timeout 40 ./$b bench --device cuda --work prefill --dtype bf16 --warmup 2 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/$tag /"; }
# ab_over "BINARIES" LABEL ARGS...: pbin of each binary of .dev/all present, interleaved, two
# rounds (env settings before the call apply to all).
ab_over() { local bins=$1 tag=$2 b r; shift 2; for r in 1 2; do for b in $bins; do [ -x ./$b ] && pbin $b "$b $tag" "$@"; done; done; }
# ab_bins LABEL ARGS...: an A/B of two builds, deltanet_base and deltanet.
ab_bins() { ab_over "deltanet_base deltanet" "$@"; }
# shape_args SHAPE: bench's shape arguments; `varlen` is the issues' 64 sequences in 65536 tokens.
shape_args() { if [ "$1" = varlen ]; then echo "--shape 1,65536,16,32,128,128 --varlen 64"; else echo "--shape $1"; fi; }
# db ARGS...: the decode bench's lines (single launches, back to back, the device copy).
db() { timeout 25 ./deltanet bench --device cuda --work decode --dtype bf16 --warmup 30 --repeats 1000 "$@" 2>&1 | grep -E "^decode|^d2d"; }
# The issues' four fixed prefill shapes (B,T,H,HV,K,V), as anchors.py's --shapes takes them; the
# fifth is varlen, 64 sequences in 65536 tokens.
ISSUE_SHAPES="1,32768,16,32,128,128;1,65536,16,32,128,128;8,8192,16,32,128,128;1,2048,16,32,128,128"
# issue_shapes: the five shapes in both precisions, JSON per shape in $R.
issue_shapes() {
  for P in exact fast; do
    for s in ${ISSUE_SHAPES//;/ }; do
      pb "$P $s" --precision $P --shape $s --repeats 20 --json $R/shape_${P}_${s//,/_}.json
    done
    pb "$P varlen64 1,65536" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20 --json $R/shape_${P}_varlen64.json
  done
}
# checks_and_sanitizers: the tests a landed build runs on the GPU besides selftest and
# fused_equals (the fast precision, non-finite rows, engine) and compute-sanitizer (racecheck in
# both precisions, 128 columns forced; memcheck over varlen).
checks_and_sanitizers() {
  run fast 90 env DELTANET_FUSED_CASES=12 ./fused_test fused_fast_precision --nocapture
  run non_finite 60 env DELTANET_FUSED_CASES=3 ./fused_test fused_keeps_non_finite --nocapture
  run engine 60 ./engine_test --nocapture
  local cs sh p
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  sh="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
  for p in exact fast; do
    run race_$p 90 env DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $cs --tool racecheck --error-exitcode 9 ./deltanet bench $sh --precision $p --shape 2,300,4,8,128,128
  done
  run mem_varlen 90 $cs --tool memcheck --error-exitcode 9 ./deltanet bench $sh --precision exact --shape 1,1200,16,32,128,128 --varlen 9
}
# build_checks: every check of a build on the GPU (selftest on $TOP/.gpu/vectors in both
# precisions, fused_equals, then checks_and_sanitizers), packing between.
build_checks() {
  run selftest_exact 120 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
  run selftest_fast 120 ./deltanet selftest --device cuda --precision fast --vectors $TOP/.gpu/vectors
  run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
  pack
  checks_and_sanitizers
}
# shapes_beside_fla: issue_shapes of $BIN, then FLA (anchors.py) on the same shapes, JSON in $R,
# packing after each (issue 8's bar; .gpu/fla and .gpu/anchors.py carried).
shapes_beside_fla() {
  issue_shapes 2>&1 | tee $R/shapes.txt
  pack
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > $R/pip.txt 2>&1
  PYTHONPATH=/tmp/site timeout 150 python3 $TOP/.gpu/anchors.py --impl fla --shapes "$ISSUE_SHAPES" --varlen "64,65536,16,32,128,128" --json $R/fla_shapes.json 2>&1 | tail -6 | tee $R/fla.txt
  pack
}
# per_token T...: B=1 prefill of $BIN (default deltanet) at each T in both precisions (5
# repeats), JSON per run in $R.
per_token() {
  local p t
  for p in exact fast; do
    for t in "$@"; do
      timeout 90 ./"${BIN:-deltanet}" bench --device cuda --work prefill --dtype bf16 --warmup 1 --precision $p --shape 1,$t,16,32,128,128 --repeats 5 --json $R/tok_${p}_$t.json 2>&1 | grep -E "^prefill" | sed "s/^/$p T=$t /"
    done
  done 2>&1 | tee $R/per_token.txt
}
# ncu_fast KERNEL: Nsight Compute on one launch of KERNEL in the fast forward at B=8 T=4096 (the
# details page, and stall samples and shared-memory wavefronts by SASS instruction for
# `dev/ncu_phases.py`), in $R; the headline lines shown.
ncu_fast() {
  local k=$1 ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 150 "$ncu" --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis --kernel-name regex:"^$k\$" --launch-skip 2 --launch-count 1 -f -o $R/$k ./deltanet bench --device cuda --work prefill --dtype bf16 --precision fast --shape 8,4096,16,32,128,128 --warmup 2 --repeats 1 > $R/${k}_run.txt 2>&1
  "$ncu" -i $R/$k.ncu-rep --page details > $R/${k}_details.txt 2>&1
  "$ncu" -i $R/$k.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $R/${k}_sass.csv.gz
  rm -f $R/$k.ncu-rep
  grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|No Eligible|Achieved Occ|Memory Throughput|DRAM Throughput|L1/TEX|Shared|Bank" $R/${k}_details.txt | head -20
}
# intra_ab_checks_ncu AB: an A/B function (ab_bins or a script's own) over chunk_intra alone and the
# forward, fast and exact, B=8 T=8192, into $R/ab.txt; then build_checks and ncu_fast of
# chunk_intra, packing between.
intra_ab_checks_ncu() {
  local ab=$1 P
  for P in fast exact; do
    DELTANET_FUSED_ONLY=intra $ab "intra-only $P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
    $ab "$P B=8" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
  done 2>&1 | tee $R/ab.txt
  pack
  build_checks
  pack
  ncu_fast chunk_intra
  pack
}

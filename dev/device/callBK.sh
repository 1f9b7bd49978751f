#!/usr/bin/env bash
# Sixteenth stop, second call. Call BJ: the row skip written as tests inside the unrolled
# product loops made whole chunks ~10 % slower (B=8 3.64 -> 4.01 ms on an H100). Now the
# products come in two builds (whole chunks as before; short chunks with the skip, opt-in
# DELTANET_FUSED_ROWSKIP=1). A/B, interleaved: ./deltanet_base (c8dad45); this build (persistent
# blocks on); persistent off; row skip on. Then sanitizers and fused_equals for the new build.
# run(command="bash .dev/all/callBK.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bk; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
{
for round in 1 2 3; do
  for b in base new persist0 rowskip; do
    case $b in base) X="./deltanet_base"; E="";; new) X="./deltanet"; E="";; persist0) X="./deltanet"; E="DELTANET_FUSED_PERSIST=0";; rowskip) X="./deltanet"; E="DELTANET_FUSED_ROWSKIP=1";; esac
    for s in "varlen64 --shape 1,65536,16,32,128,128 --varlen 64" "B8 --shape 8,8192,16,32,128,128"; do
      set -- $s; lab=$1; shift
      env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision exact --repeats 30 "$@" 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b exact $lab /"
    done
    [ $b = new ] || [ $b = rowskip ] && env $E timeout 40 $X bench --device cuda --work prefill --dtype bf16 --warmup 2 --precision fast --repeats 30 --shape 1,65536,16,32,128,128 --varlen 64 2>&1 | grep -E "^prefill" | sed "s/^/r$round $b fast varlen64 /"
  done
  PYTHONPATH=/tmp/site timeout 90 python3 $TOP/.gpu/anchors.py --impl fla --shapes "" --varlen "64,65536,16,32,128,128" 2>&1 | tail -1 | sed "s/^/r$round /"
  pack
done
} 2>&1 | tee $R/ab.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SH="--device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1"
run race_rowskip 90 env DELTANET_FUSED_ROWSKIP=1 DELTANET_FUSED_BLOCKS=3 $CS --tool racecheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run mem_rowskip 90 env DELTANET_FUSED_ROWSKIP=1 DELTANET_FUSED_BLOCKS=3 $CS --tool memcheck --error-exitcode 9 ./deltanet bench $SH --shape 1,700,2,4,128,128 --varlen 5
run fused_equals 150 env DELTANET_FUSED_CASES=2 ./fused_test fused_equals --nocapture
pack

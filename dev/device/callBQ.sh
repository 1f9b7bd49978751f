#!/usr/bin/env bash
# The landed build (exact wgmma kernel as in b879877, fast with Q H^T beside v_new) and the
# opt-in WG_TRI (the triangular products on wgmma too; host-emulated only), short: (1)
# fused_equals (one case, every tuning: WG_TRI among them), selftest on the vectors, non-finite
# rows; (2) A/B DELTANET_FUSED_WGTRI=0|1, exact and fast, B=8 and varlen; (3) racecheck WG_TRI.
# run(command="bash .dev/all/callBQ.sh", carry=[".dev/all", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bq; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run fused_equals 100 env DELTANET_FUSED_CASES=1 ./fused_test fused_equals --nocapture
run selftest 60 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run non_finite 40 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite --nocapture
pack
{
for P in exact fast; do
  for W in 0 1; do
    DELTANET_FUSED_WGTRI=$W pb "wgtri=$W $P 8,8192" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
    DELTANET_FUSED_WGTRI=$W pb "wgtri=$W $P varlen64" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  done
done
} 2>&1 | tee $R/ab.txt
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run race_tri 60 env DELTANET_FUSED_WGTRI=1 DELTANET_FUSED_VT=128 DELTANET_FUSED_SPLIT=0 $CS --tool racecheck --error-exitcode 9 ./deltanet bench --device cuda --work prefill --dtype bf16 --warmup 0 --repeats 1 --precision exact --shape 2,300,4,8,128,128
pack

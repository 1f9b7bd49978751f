#!/usr/bin/env bash
# The landed build (exact wgmma kernel as in b879877, fast with Q H^T running beside v_new), short:
# selftest on the vectors and the non-finite rows (the two checks call BO did not run on this
# exact kernel), then exact and fast at varlen and B=8 beside FLA, one round.
# run(command="bash .dev/all/callBQ.sh", carry=[".dev/all", ".gpu/fla", ".gpu/anchors.py", ".gpu/vectors"])
cd "$(dirname "$0")"
TOP=$PWD/../..
TAG=bq; R=$OUT/$TAG; mkdir -p $R
. ./lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>&1; cat $R/gpu.txt
run selftest 90 ./deltanet selftest --device cuda --vectors $TOP/.gpu/vectors
run non_finite 60 env DELTANET_FUSED_CASES=2 ./fused_test fused_keeps_non_finite --nocapture
pack
{
for P in exact fast; do
  pb "$P varlen64" --precision $P --shape 1,65536,16,32,128,128 --varlen 64 --repeats 20
  pb "$P 8,8192" --precision $P --shape 8,8192,16,32,128,128 --repeats 20
done
} 2>&1 | tee $R/shapes.txt
pack
python3 -m pip install -q --no-index --no-deps --target /tmp/site $TOP/.gpu/fla/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 $TOP/.gpu/anchors.py --impl fla --shapes "8,8192,16,32,128,128" --varlen "64,65536,16,32,128,128" 2>&1 | tail -2 | tee $R/fla.txt
pack
